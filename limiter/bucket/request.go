package bucket

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"hash/maphash"
	"sync"
	"time"
)

// Request asks a store to charge Cost tokens from one bucket: the bucket of
// Key in Zone, shaped by Policy.
type Request struct {
	// Zone names the limit. Buckets of different zones are distinct.
	Zone string
	// Key is the client key as resolved from the HTTP request (an IP, an
	// API key...). Stores keep only a digest of it.
	Key string
	// Policy is the bucket's shape. A bucket whose policy changed keeps its
	// state: a token bucket, the time until it is full again, capped at the
	// new burst's (see takeToken).
	Policy Policy
	// Cost is the number of tokens the request uses; at least 1.
	Cost int64
	// digest is KeyHash(Key), when WithDigest computed it.
	digest    [16]byte
	hasDigest bool
	// ID is unique to the HTTP request. It names the concurrency slot the
	// request holds until Release, and, in Redis, the entries of a sliding
	// log, so that a refund removes exactly them. Other algorithms ignore it.
	ID string
	// DryRun is set for a zone in dry run: a Limiter decides and charges
	// it apart from the others, and it never refuses (its refusal is the
	// state WouldRefuse). Stores ignore it.
	DryRun bool
	// Global marks a zone whose limit holds for every region (package
	// limiter/regions): what it admits is told to the other regions.
	// Stores ignore it.
	Global bool
	// Sync, when positive, decides the request in this process and
	// reconciles its bucket with Redis at most every Sync (see package
	// fleetsync): a token bucket's zone that trades exactness for cost,
	// within a stated bound. Zero: exact, in Redis. The memory store
	// ignores it.
	Sync time.Duration
	// Block, when positive, refuses the request at once, for that long,
	// whatever its bucket holds, and charges nothing: an operator's block
	// of the client (an override). Stores ignore it.
	Block time.Duration
}

// WithDigest returns r with its key's digest computed by h (KeyHash when
// h is nil), once for the several lookups of one request (the stores, the
// caches, the bans). Key must not change afterwards.
func (r Request) WithDigest(h *KeyHasher) Request {
	r.digest, r.hasDigest = h.Sum(r.Key), true
	return r
}

// Anonymous is r without its client key and ID, its digest kept: all a
// store needs to name its bucket, for what is kept long (a region's counts
// for its peers).
func (r Request) Anonymous() Request {
	r.digest, r.hasDigest = r.Digest(), true
	r.Key, r.ID = "", ""
	return r
}

// RequestOf is a request of a global zone's bucket named by id, of no
// client key, with policy p (of id's algorithm): what a store needs to
// charge it.
func RequestOf(id ID, p Policy) Request {
	return Request{Zone: id.Zone, Policy: p, Global: true, digest: id.Hash, hasDigest: true}
}

// Digest is the digest WithDigest computed, or else KeyHash(r.Key).
func (r Request) Digest() [16]byte {
	if r.hasDigest {
		return r.digest
	}
	return KeyHash(r.Key)
}

// ID identifies a client's bucket in this process: its zone, its
// algorithm (each keeps its state in its own way, so a zone whose algorithm
// changes starts afresh) and the digest of its client key. It keys a
// memstore.Store's buckets and bans, and a RefusedCache's entries.
type ID struct {
	Zone string
	Algo Algorithm
	Hash [16]byte
}

// IDOf is the ID of r's bucket.
func IDOf(r Request) ID {
	return ID{Zone: r.Zone, Algo: r.Policy.Algorithm, Hash: r.Digest()}
}

// KeyHash is the fixed-length digest under which a client key is stored:
// the first 16 bytes of its SHA-256. Raw keys, which may be long or
// sensitive, are never kept.
func KeyHash(key string) [16]byte {
	sum := sha256.Sum256([]byte(key))
	return [16]byte(sum[:16])
}

// KeyHasher computes the digests of client keys keyed by a secret: the
// first 16 bytes of the HMAC-SHA-256 of the key. Whoever does not know the
// secret cannot tell a key's digest, and so cannot choose keys whose
// buckets land in one Redis Cluster hash slot (one shard). Instances that
// share buckets must share the secret. A nil *KeyHasher computes KeyHash.
// Safe for concurrent use.
type KeyHasher struct {
	macs sync.Pool // of *keyMAC
	// local: digests that never leave this process (ProcessKeyHasher).
	local       bool
	seed, seed2 maphash.Seed
}

// keyMAC is an HMAC of the secret, ready for Reset, with room for a key
// and a sum: no allocation once warm.
type keyMAC struct {
	mac hash.Hash
	key []byte
	sum [sha256.Size]byte
}

// NewKeyHasher returns the hasher of secret, or nil (KeyHash) when secret
// is empty.
func NewKeyHasher(secret string) *KeyHasher {
	if secret == "" {
		return nil
	}
	return &KeyHasher{macs: sync.Pool{New: func() any { return &keyMAC{mac: hmac.New(sha256.New, []byte(secret))} }}}
}

// Sum is the digest of key (KeyHash when h is nil).
func (h *KeyHasher) Sum(key string) [16]byte {
	switch {
	case h == nil:
		return KeyHash(key)
	case h.local:
		var d [16]byte
		binary.LittleEndian.PutUint64(d[:8], maphash.String(h.seed, key))
		binary.LittleEndian.PutUint64(d[8:], maphash.String(h.seed2, key))
		return d
	}
	m := h.macs.Get().(*keyMAC)
	m.mac.Reset()
	m.key = append(m.key[:0], key...)
	m.mac.Write(m.key)
	digest := [16]byte(m.mac.Sum(m.sum[:0]))
	if cap(m.key) > 1024 { // a huge key's room is not kept
		m.key = nil
	}
	h.macs.Put(m)
	return digest
}

// ProcessKeyHasher digests client keys for the memory store alone, where
// a digest never leaves the process: two 64-bit maphash sums under seeds
// drawn at random when the process starts (the same for every handler,
// so that handlers sharing the memory store share its buckets). Keys that
// collide need about 2^64 keys by chance, and a client cannot aim for a
// collision without the seeds, which nothing reveals. It costs a few
// nanoseconds where SHA-256 costs hundreds. Never for Redis, whose key
// names must be the same in every instance.
var ProcessKeyHasher = &KeyHasher{local: true, seed: maphash.MakeSeed(), seed2: maphash.MakeSeed()}
