package lane

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracing"
)

// Deps are what every lane of an instance shares.
type Deps struct {
	// Bus carries control messages between the instances (core NATS).
	Bus Bus
	// Targets opens the lanes' targets.
	Targets Targets
	Queue   Queue
	// Store holds the lanes' GCRA states (memory or Redis).
	Store bucket.Store
	// Pair takes the slots of keyed lanes (the same states as Store), and
	// Claims decides which instance reads each key; both are needed only
	// by lanes with per_key.
	Pair   bucket.PairStore
	Claims keyed.Claims
	// Slow shares keys' slow-downs (per_key.adaptive) between instances;
	// nil keeps each instance's own (one instance: the memory pacer).
	Slow keyed.SlowStore
	// Leases bound keyed lanes' and keys' jobs in flight across the fleet;
	// nil bounds them per instance (one instance: the memory pacer).
	Leases keyed.Leases
	// Limits keeps the limits changed at runtime (PATCH of a lane, per-key
	// overrides); nil keeps them in memory only.
	Limits LimitStore
	// Handlers are in-process targets by name (target: {handler: name}).
	Handlers map[string]dispatch.Target
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	// Clock is the time source; nil means clock.Real.
	Clock clock.Clock
	// DedupWindow and Replicas shape the lane's stream.
	DedupWindow time.Duration
	Replicas    int
	// Instance names this instance in control messages.
	Instance string
	// Hub carries each HTTP job's slot back to the instance that took it;
	// nil tells nobody.
	Hub Teller
	// Workers are the worker users of each pull-mode lane by lane name
	// (config.NATS.WorkersOf); a lane with none answers any worker inbox.
	Workers map[string][]string
	// CallbackLanes are the lanes some lane names as its
	// results.callback_lane: they take no job published on their public
	// subject (queue.LaneSpec.CallbacksOnly).
	CallbackLanes map[string]bool
	// Records keeps the job records of the lanes with results; nil keeps
	// none (a lane's results are then refused at New).
	Records Records
	// HistoryEvery is the interval of the lane's throughput samples
	// (history.go); zero: DefaultHistoryEvery.
	HistoryEvery time.Duration
	// Traces makes the spans of each job's wait and attempts (trace.go);
	// nil makes none, and the job's trace context still reaches its
	// target.
	Traces *tracing.Tracer
}

// Queue is what a lane uses of the queue (queue.Queue): its streams, and
// the counts its status reports.
type Queue interface {
	Streams
	Counts
}

// Streams are the queue's streams as a lane runs them.
type Streams interface {
	EnsureLane(ctx context.Context, spec queue.LaneSpec) error
	EnsureKeyedLane(ctx context.Context, spec queue.LaneSpec) error
	Consumer(lane string) (*queue.Consumer, error)
	KeyedReader(lane string) (*queue.KeyedReader, error)
	// OnStored hears each job stored by this instance on a keyed lane.
	OnStored(lane string, f func(key string))
	// OnPoison hears each job of lane dead-lettered at once as poison.
	OnPoison(lane string, f func())
	// OnDuplicate hears each job published on a keyed lane's public
	// subjects that was dropped, as a duplicate, when moved into its lane.
	OnDuplicate(lane string, f func())
	RunIntake(ctx context.Context, lane string, log *slog.Logger)
	MoveRetries(ctx context.Context, lane string, log *slog.Logger)
	// ShareReadAhead shares the lane's jobs fetched and not yet given a
	// slot with the other instances, for their queued answers' eta_ms.
	ShareReadAhead(ctx context.Context, lane string, c *queue.Consumer)
}

// Counts are what a lane's status (and a keyed pull-mode lane) reads of
// its queue.
type Counts interface {
	Stats(ctx context.Context, lane string) (queue.LaneStats, error)
	BusiestKeys(ctx context.Context, lane string, n int, maxAge time.Duration) ([]queue.KeyCount, error)
	CountDead(ctx context.Context, lane string) (uint64, error)
	RetriesWaiting(ctx context.Context, lane string) (uint64, error)
	Backlog(ctx context.Context, lane string, maxAge time.Duration) (int64, error)
}

// LimitStore keeps the limits changed at runtime (queue.Limits).
type LimitStore interface {
	PutLane(ctx context.Context, lane string, v queue.LaneLimit) error
	PutKey(ctx context.Context, lane, key string, v queue.KeyLimit) error
	// PutPause holds or releases the lane on every instance; rev is the
	// stored entry's revision.
	PutPause(ctx context.Context, lane string, v queue.LanePause) (rev uint64, err error)
	Watch(ctx context.Context, lane string, w queue.LimitsWatch) error
}

// Teller tells the instance at address that took job id of lane over HTTP
// the slot its drain gave the job: due in in, free or not (queue.Hub).
type Teller interface {
	Tell(address, lane, id string, in time.Duration, free bool)
}

// Bus carries a lane's control messages (a *nats.Conn).
type Bus interface {
	Subscribe(subject string, cb nats.MsgHandler) (*nats.Subscription, error)
	Publish(subject string, data []byte) error
}

// Targets opens lanes' targets: any target, or a pull-mode one.
type Targets interface {
	Open(ctx context.Context, cfg dispatch.TargetConfig) (dispatch.Target, func(), error)
	OpenPull(cfg dispatch.PullConfig) (*dispatch.Pull, error)
}

// NATSTargets opens targets with dispatch.Open on Conn and pull-mode
// targets with dispatch.OpenPull on Pull; Guard checks HTTP targets'
// addresses.
type NATSTargets struct {
	Conn *nats.Conn
	// Pull carries pull-mode lanes' traffic with workers: a connection
	// that may publish to workers' inboxes only; nil uses Conn.
	Pull  *nats.Conn
	Guard *dispatch.Guard
}

var (
	_ Targets    = NATSTargets{}
	_ Queue      = (*queue.Queue)(nil)
	_ Teller     = (*queue.Hub)(nil)
	_ Bus        = (*nats.Conn)(nil)
	_ LimitStore = (*queue.Limits)(nil)
)

// Open implements Targets.
func (t NATSTargets) Open(ctx context.Context, cfg dispatch.TargetConfig) (dispatch.Target, func(), error) {
	return dispatch.Open(ctx, cfg, t.Guard, t.Conn)
}

// OpenPull implements Targets.
func (t NATSTargets) OpenPull(cfg dispatch.PullConfig) (*dispatch.Pull, error) {
	nc := t.Pull
	if nc == nil {
		nc = t.Conn
	}
	return dispatch.OpenPull(nc, cfg)
}
