package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoRoom: JetStream refused a stream because the storage it may use
// cannot hold the stream's max_bytes beside what its other streams
// reserve (a file stream with max_bytes reserves them when it is created
// or raised): error code 10047, from a single server or an account's
// limits. A cluster with no peer that has room answers 10005 (no suitable
// peers for placement), which names no field and is passed on as it is.
var ErrNoRoom = errors.New("JetStream has no room to reserve the stream's max_bytes")

// ensureStream creates the stream, or updates it only when its config
// differs: several instances starting at once then send no update for an
// unchanged stream (an update also briefly stalls the stream's consumers).
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		st, err = js.UpdateStream(ctx, cfg)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == codeStorageResourcesExceed {
		if cfg.MaxBytes > 0 {
			return nil, fmt.Errorf("%w (%d bytes): %w", ErrNoRoom, cfg.MaxBytes, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrNoRoom, err)
	}
	return st, err
}

// ensureConsumer is ensureStream for a durable consumer.
func ensureConsumer(ctx context.Context, st jetstream.Stream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := st.CreateConsumer(ctx, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return st.UpdateConsumer(ctx, cfg)
	}
	return c, err
}

// ensureKV is ensureStream for a key-value bucket. CreateOrUpdateKeyValue
// sends an update whenever the bucket exists, and on a fresh cluster with
// R3 buckets the updates of instances starting at the same moment time out
// behind each other (fleet TestFleetStartsTogether); creating a bucket that
// exists with the same config is answered at once.
func ensureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.UpdateKeyValue(ctx, cfg)
	}
	return kv, err
}
