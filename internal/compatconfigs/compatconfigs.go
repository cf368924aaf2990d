// Package compatconfigs holds caddy-ratelimit's documented configurations
// and the configurations of its tests, copied verbatim from
// github.com/mholt/caddy-ratelimit (Apache License 2.0) at commit
// 5625512f24f6f59d6f64fb3aafe5eecff0b286db, each under a comment that
// names its file. The tests of this module load them unchanged
// (compat_test.go, internal/e2e/compat_test.go). The test configurations
// are fmt formats, as there: their comments give the arguments.
package compatconfigs

// ReadmeOrder: README.md, "Caddyfile config": the order global option.
const ReadmeOrder = `{
	order rate_limit after basic_auth
}
`

// ReadmeJSON: README.md, "JSON example".
const ReadmeJSON = `{
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":80"],
					"routes": [
						{
							"handle": [
								{
									"handler": "rate_limit",
									"rate_limits": {
										"static_example": {
											"match": [
												{"method": ["GET"]}
											],
											"key": "static",
											"window": "1m",
											"max_events": 100
										},
										"dynamic_example": {
											"key": "{http.request.remote.host}",
											"window": "5s",
											"max_events": 2
										}
									},
									"distributed": {},
									"log_key": true
								},
								{
									"handler": "static_response",
									"body": "I'm behind the rate limiter!"
								}
							]
						}
					]
				}
			}
		}
	}
}
`

// ReadmeCaddyfile: README.md, "Caddyfile example".
const ReadmeCaddyfile = `:80

rate_limit {
	distributed
	zone static_example {
		match {
			method GET
		}
		key    static
		events 100
		window 1m
	}
	zone dynamic_example {
		key    {remote_host}
		events 2
		window 5s
	}
	log_key
}

respond "I'm behind the rate limiter!"
`

// ReadmePrefixJSON: README.md, "Network prefix rate limiting", JSON (a handler).
const ReadmePrefixJSON = `{
	"handler": "rate_limit",
	"rate_limits": {
		"per_network": {
			"key": "{http.request.remote.host}",
			"window": "1m",
			"max_events": 100,
			"ipv6_prefix": 64
		}
	}
}
`

// ReadmePrefixCaddyfile: README.md, "Network prefix rate limiting", Caddyfile (a directive).
const ReadmePrefixCaddyfile = `rate_limit {
	zone per_network {
		key         {remote_host}
		events      100
		window      1m
		ipv6_prefix 64
	}
}
`

// TestCaddyfile: caddyfile_test.go, TestCaddyfileRateLimits (fmt: window 60, events 10).
const TestCaddyfile = `
	{
		skip_install_trust
		admin localhost:2999
		http_port 8080
	}

	localhost:8080
	
	rate_limit {
		zone zone1 {
			match {
				method GET
			}
			key static
			window %ds
			events %d
		}
	}

	respond 200
	`

// TestRateLimits: handler_test.go, TestRateLimits (fmt: window 60, events 10).
const TestRateLimits = `{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":8080"],
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"zone1": {
										"match": [{"method": ["GET"]}],
										"key": "static",
										"window": "%ds",
										"max_events": %d
									}
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`

// TestDistinctZones: handler_test.go, TestDistinctZonesAndKeys (fmt: events 10, 10).
const TestDistinctZones = `{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":8080"],
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"zone1": {
										"match": [{"method": ["GET"]}],
										"key": "{http.request.orig_uri.path}",
										"window": "60s",
										"max_events": %d
									},
									"zone2": {
										"match": [{"method": ["DELETE"]}],
										"key": "{http.request.orig_uri.path}",
										"window": "60s",
										"max_events": %d
									}
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`

// TestDistributed: distributed_test.go, TestDistributed (fmt: storage dir, zone, window 60, events 10).
const TestDistributed = `{
	"admin": {"listen": "localhost:2999"},
	"storage": {
		"module": "file_system",
		"root": "%s"
	},
	"logging": {
		"logs": {
			"default": {
				"level": "DEBUG"
			}
		}
	},
	"apps": {
		"http": {
			"servers": {
				"one": {
					"listen": [":8080"],
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"%s": {
										"match": [{"method": ["GET"]}],
										"key": "static",
										"window": "%ds",
										"max_events": %d
									}
								},
								"distributed": {
									"write_interval": "3600s",
									"read_interval": "3600s",
									"purge_age": "7200s"
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`

// TestMetrics: metrics_test.go, TestMetrics (fmt: window 10, events 2).
const TestMetrics = `{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":8080"],
					"metrics": {},
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"test_zone": {
										"match": [{"method": ["GET"]}],
										"key": "static",
										"window": "%ds",
										"max_events": %d
									}
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`
