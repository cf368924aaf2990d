package overrides

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Writer writes overrides to a Redis this instance does not read: another
// region's, which the overrides of global zones are copied to (package
// limiter/regions, copies.go). A change is announced there as one made
// there is, so that the region's instances read it at once.
type Writer struct{ r *redisOverrides }

// NewRedisWriter returns a Writer to the Redis of client, under prefix,
// in database db, as NewRedis keeps them.
func NewRedisWriter(client redis.UniversalClient, prefix string, db int) *Writer {
	return &Writer{r: NewRedis(client, prefix, db, nil).src.(*redisOverrides)}
}

// Put writes a change of zone's override (its key's, when digest is set)
// made elsewhere: ov as PutStamped or DeleteStamped returned it (a
// tombstone for a deletion), stamped. Nil when the Redis holds this
// change or a later one.
func (w *Writer) Put(ctx context.Context, zone string, digest *[16]byte, ov Override) error {
	if err := ov.Check(digest != nil); err != nil {
		return err
	}
	if _, _, err := w.r.write(ctx, zone, digest, ov); err != nil {
		return fmt.Errorf("writing the override: %w", err)
	}
	return nil
}
