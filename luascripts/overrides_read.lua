-- Reads the version of the overrides and all of them, at one instant.
-- KEYS[1]: the hash of the overrides; KEYS[2]: their version.
-- Returns {version, {name, JSON, name, JSON, ...}}.
return {redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1])}
