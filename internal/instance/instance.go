// Package instance is the misconfiguration guard of a throttler fleet. An
// in-memory pacer is correct for one instance only. Two instances sharing a JetStream, each with its own in-memory lane
// state, would each drain every lane at its full rate (behind a load
// balancer, N instances multiply the limit by N), and an instance without
// Redis next to instances with Redis would add its own rate to theirs. Every
// instance therefore announces itself in a JetStream key-value bucket, and
// refuses to start next to a live instance of the other kind:
//
//   - an instance with the in-memory pacer claims the key "memory-pacer"
//     (atomic create); one with Redis puts "redis.<id>";
//   - an in-memory instance refuses while another holds the claim or any
//     Redis instance is registered; a Redis instance refuses while the claim
//     is held;
//   - entries are refreshed every Timing.Refresh and expire Timing.TTL after the
//     last refresh (the bucket's max age), so a crashed instance's entry goes
//     away by itself; a clean stop deletes it at once.
//
// An entry found at start may belong to a live instance or to a crashed one.
// The guard tells them apart by waiting: a live instance refreshes its entry
// (a new revision) within Timing.Refresh, a crashed one's entry expires
// within Timing.TTL. So a second instance is refused within about a
// refresh, and an instance restarted after a kill -9 starts within about a
// TTL, saying
// so in the log. The bucket lives in memory on the NATS server: a restarted
// server holds no stale entries, and live instances put theirs back at their
// next refresh.
package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

const (
	// Bucket is the guard's key-value bucket; an operator can list it
	// (nats kv ls THROTTLER_INSTANCES).
	Bucket = "THROTTLER_INSTANCES"
	// MemoryPacerKey is the claim of the one in-memory instance.
	MemoryPacerKey = "memory-pacer"
	// redisKeyPrefix starts the entry of each instance that uses Redis.
	redisKeyPrefix = "redis."
)

// ErrConflict is matched (errors.Is) by the error of an instance that
// refuses to start, or stops, because another instance shares its JetStream
// with a different lane-state store.
var ErrConflict = errors.New("pacer conflict")

// Timing is the guard's clock: how long an entry lives without a refresh,
// how often it is refreshed, how often a waiting start looks again.
type Timing struct {
	TTL, Refresh, Poll time.Duration
}

// DefaultTiming lets a refresh fail twice (NATS reconnecting) before an
// entry expires.
var DefaultTiming = Timing{TTL: 10 * time.Second, Refresh: 3 * time.Second, Poll: 250 * time.Millisecond}

// Pacer kinds an instance announces.
const (
	PacerMemory = "memory"
	PacerRedis  = "redis"
)

// Info is the value of an entry: who holds it.
type Info struct {
	ID      string    `json:"id"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Listen  string    `json:"listen"`
	Pacer   string    `json:"pacer"`
	Started time.Time `json:"started"`
	// Held is, per lane, how many slots this instance may hold reserved
	// and not yet started (leaky.MaxHeld of the lane's batch). An instance
	// that restores a lane state Redis lost leaves room for what the others
	// hold (Entry.HeldByOthers). Lanes absent hold none.
	Held map[string]int `json:"held,omitempty"`
}

// String names the instance for error messages and logs.
func (i Info) String() string {
	return fmt.Sprintf("id %s, host %s, pid %d, listen %s", i.ID, i.Host, i.PID, i.Listen)
}

// Config says who this instance is and where the guard keeps its entries.
type Config struct {
	JetStream jetstream.JetStream
	// Self describes this instance; Self.Pacer is PacerMemory or
	// PacerRedis, Self.ID is filled in when empty.
	Self Info
	// Timing: the zero value means DefaultTiming.
	Timing Timing
	Logger *slog.Logger
}

// Entry is this instance's entry, held from Claim until Release.
type Entry struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	key    string
	self   Info
	timing Timing
	log    *slog.Logger

	mu  sync.Mutex
	rev uint64

	stop    context.CancelFunc
	stopped chan struct{}
	lost    error // set before the service's context is cancelled

	// others is the latest look at the live Redis instances other than
	// this one, by key (see HeldByOthers).
	others atomic.Pointer[map[string]Info]
}

// Claim registers this instance in the guard's bucket and refuses (an
// error matching ErrConflict) when a live instance of the other kind shares
// the JetStream. On success the entry is refreshed until Release is called,
// and the returned context is cancelled if the entry is lost to another
// instance, so that the service stops; Lost then says why.
func Claim(ctx context.Context, cfg Config) (context.Context, *Entry, error) {
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Self.ID == "" {
		cfg.Self.ID = nuid.Next()
	}
	if cfg.Self.Host == "" {
		cfg.Self.Host, _ = os.Hostname()
	}
	if cfg.Self.PID == 0 {
		cfg.Self.PID = os.Getpid()
	}
	if cfg.Self.Started.IsZero() {
		cfg.Self.Started = time.Now().UTC()
	}
	c := &Entry{js: cfg.JetStream, timing: cfg.Timing, log: cfg.Logger.With("component", "guard"), self: cfg.Self}
	if err := c.ensureBucket(ctx); err != nil {
		return nil, nil, err
	}
	var err error
	if c.self.Pacer == PacerMemory {
		c.key = MemoryPacerKey
		err = c.claimMemory(ctx)
	} else {
		c.key = redisKeyPrefix + c.self.ID
		err = c.registerRedis(ctx)
	}
	if err != nil {
		return nil, nil, err
	}
	svcCtx, cancelSvc := context.WithCancel(ctx)
	refreshCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop, c.stopped = stop, make(chan struct{})
	var loops sync.WaitGroup
	if c.key != MemoryPacerKey {
		c.lookAtOthers(ctx)
		loops.Go(func() { c.othersLoop(refreshCtx) })
	}
	loops.Go(func() { c.refreshLoop(refreshCtx, cancelSvc) })
	go func() {
		loops.Wait()
		close(c.stopped)
	}()
	c.log.Info("instance registered", "key", c.key, "id", c.self.ID, "pacer", c.self.Pacer)
	return svcCtx, c, nil
}

// ensureBucket creates the guard's bucket, or updates it to this
// instance's TTL. It is in memory: after a NATS restart it is made again.
func (c *Entry) ensureBucket(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "throttler instances and the in-memory pacer claim (misconfiguration guard)",
		TTL:         c.timing.TTL,
		History:     1,
		Storage:     jetstream.MemoryStorage,
	}
	// Created, and updated only when it exists with another config:
	// CreateOrUpdateKeyValue always updates an existing bucket, and the
	// updates of instances starting at the same moment on a fresh cluster
	// time out behind each other (fleet TestFleetStartsTogether).
	kv, err := c.js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = c.js.UpdateKeyValue(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("instance guard: key-value bucket %s: %w", Bucket, err)
	}
	c.kv = kv
	return nil
}

// claimMemory takes the memory-pacer claim, waiting out a claim left by a
// crashed instance, then checks that no instance uses Redis.
func (c *Entry) claimMemory(ctx context.Context) error {
	value := c.value()
	deadline := time.Now().Add(c.timing.TTL + 2*c.timing.Refresh)
	var waitedFor string
	for {
		rev, err := c.kv.Create(ctx, MemoryPacerKey, value)
		if err == nil {
			c.rev = rev
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("instance guard: claim %s: %w", MemoryPacerKey, err)
		}
		holder, live, err := c.watch(ctx, []string{MemoryPacerKey}, deadline, &waitedFor)
		if err != nil {
			return err
		}
		if live {
			return fmt.Errorf("%w: another throttler instance (%s) already uses this JetStream with the in-memory pacer; "+
				"configure redis.url on every instance to share one limit", ErrConflict, holder)
		}
		// The claim expired or was released: take it.
	}
	keys, err := c.redisKeys(ctx)
	if err == nil && len(keys) > 0 {
		var holder Info
		var live bool
		holder, live, err = c.watch(ctx, keys, time.Now().Add(c.timing.TTL+2*c.timing.Refresh), &waitedFor)
		if err == nil && live {
			err = fmt.Errorf("%w: throttler instances using Redis share this JetStream (one of them: %s); "+
				"this instance has no redis.url and its in-memory pacer would add its own rate to theirs: configure the same redis.url here",
				ErrConflict, holder)
		}
	}
	if err != nil {
		c.delete()
		return err
	}
	return nil
}

// registerRedis puts this instance's entry, then checks that no live
// instance holds the memory-pacer claim. Registering first closes the race
// with an in-memory instance starting at the same moment: of the two, at
// least one sees the other.
func (c *Entry) registerRedis(ctx context.Context) error {
	rev, err := c.kv.Put(ctx, c.key, c.value())
	if err != nil {
		return fmt.Errorf("instance guard: register %s: %w", c.key, err)
	}
	c.rev = rev
	var waitedFor string
	_, err = c.kv.Get(ctx, MemoryPacerKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err == nil {
		var holder Info
		var live bool
		holder, live, err = c.watch(ctx, []string{MemoryPacerKey}, time.Now().Add(c.timing.TTL+2*c.timing.Refresh), &waitedFor)
		if err == nil && live {
			err = fmt.Errorf("%w: a throttler instance (%s) uses this JetStream with the in-memory pacer; "+
				"its rate would add to the shared limit: configure the same redis.url on every instance", ErrConflict, holder)
		}
	}
	if err != nil {
		c.delete()
		return err
	}
	return nil
}

// watch decides whether the instances holding keys are alive: it returns
// live=true with one holder as soon as an entry is refreshed (a new
// revision), live=false once every entry is gone (expired or deleted), and
// live=true when neither happened by deadline. It logs once why the start
// waits (*waited remembers what it logged about).
func (c *Entry) watch(ctx context.Context, keys []string, deadline time.Time, waited *string) (Info, bool, error) {
	revs := map[string]uint64{}
	var holder Info
	for {
		gone := 0
		for _, k := range keys {
			e, err := c.kv.Get(ctx, k)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				gone++
				continue
			case err != nil:
				return holder, false, fmt.Errorf("instance guard: read %s: %w", k, err)
			}
			var info Info
			_ = json.Unmarshal(e.Value(), &info) // a foreign value still counts as an entry
			if info.ID == "" {
				info.ID = "unknown"
			}
			holder = info
			if rev, seen := revs[k]; seen && rev != e.Revision() {
				return info, true, nil
			}
			revs[k] = e.Revision()
		}
		if gone == len(keys) {
			return holder, false, nil
		}
		if what := strings.Join(keys, ","); *waited != what {
			*waited = what
			c.log.Warn("another instance's entry exists; waiting for it to be refreshed (a live instance: refuse to start) "+
				"or to expire (a crashed one: start)", "keys", what, "holder", holder.String(), "wait_at_most", time.Until(deadline).Round(time.Second).String())
		}
		if time.Now().After(deadline) {
			return holder, true, nil
		}
		select {
		case <-ctx.Done():
			return holder, false, ctx.Err()
		case <-time.After(c.timing.Poll):
		}
	}
}

// redisKeys lists the entries of instances that use Redis.
func (c *Entry) redisKeys(ctx context.Context) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := c.kv.ListKeysFiltered(cctx, redisKeyPrefix+">")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("instance guard: list instances: %w", err)
	}
	defer l.Stop()
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// refreshLoop refreshes the entry every Refresh until ctx ends. Losing the
// memory-pacer claim to another instance cancels the service.
func (c *Entry) refreshLoop(ctx context.Context, cancelSvc context.CancelFunc) {
	t := time.NewTicker(c.timing.Refresh)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := c.refresh(ctx)
		switch {
		case errors.Is(err, ErrConflict):
			c.mu.Lock()
			c.lost = err
			c.mu.Unlock()
			c.log.Error("stopping: "+err.Error(), "key", c.key)
			cancelSvc()
			return
		case err != nil && !failing:
			failing = true
			c.log.Warn("refreshing the instance entry failed; retrying", "key", c.key, "err", err)
		case err == nil && failing:
			failing = false
			c.log.Info("instance entry refreshed again", "key", c.key)
		}
	}
}

// refresh renews the entry once.
func (c *Entry) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timing.Refresh)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key != MemoryPacerKey {
		rev, err := c.kv.Put(ctx, c.key, c.value())
		if err != nil {
			// The bucket may be gone with a NATS restart.
			if err := c.ensureBucket(ctx); err != nil {
				return err
			}
			rev, err = c.kv.Put(ctx, c.key, c.value())
		}
		if err == nil {
			c.rev = rev
		}
		return err
	}
	rev, err := c.kv.Update(ctx, c.key, c.value(), c.rev)
	if err == nil {
		c.rev = rev
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// The bucket may be gone with a NATS restart; then the claim is
		// free and the create below takes it again.
		if err := c.ensureBucket(ctx); err != nil {
			return err
		}
	}
	// Our revision is gone: the claim expired (NATS restarted, or the
	// refreshes failed for a whole TTL) and may have been taken.
	if rev, err := c.kv.Create(ctx, c.key, c.value()); err == nil {
		c.rev = rev
		c.log.Warn("the in-memory pacer claim had expired; claimed it again", "key", c.key)
		return nil
	}
	e, err := c.kv.Get(ctx, c.key)
	if err != nil {
		return err
	}
	var holder Info
	_ = json.Unmarshal(e.Value(), &holder)
	if holder.ID == c.self.ID {
		c.rev = e.Revision()
		return nil
	}
	return fmt.Errorf("%w: the in-memory pacer claim was taken by another throttler instance (%s) while this one could not refresh it; "+
		"two in-memory pacers must not share a JetStream: configure redis.url on every instance", ErrConflict, holder)
}

// othersEvery is how often an instance using Redis reads the other
// instances' entries: an instance that started since the last look is not
// counted by HeldByOthers until the next one.
func (c *Entry) othersEvery() time.Duration {
	return max(c.timing.Refresh/3, c.timing.Poll, 10*time.Millisecond)
}

// othersLoop reads the other instances' entries until ctx ends.
func (c *Entry) othersLoop(ctx context.Context) {
	t := time.NewTicker(c.othersEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.lookAtOthers(ctx)
	}
}

// lookAtOthers reads the entries of the other live instances using Redis.
// On an error the previous look stays: an instance that went away is then
// counted a little longer, which only costs capacity.
func (c *Entry) lookAtOthers(ctx context.Context) {
	keys, err := c.redisKeys(ctx)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.othersEvery())
	defer cancel()
	others := make(map[string]Info, len(keys))
	for _, k := range keys {
		if k == c.key {
			continue
		}
		e, err := c.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return
		}
		var info Info
		_ = json.Unmarshal(e.Value(), &info) // a foreign value counts as holding nothing
		others[k] = info
	}
	c.others.Store(&others)
}

// HeldByOthers is how many slots of lane the other live instances using
// Redis may hold reserved and not yet started: the sum of their Info.Held
// for the lane, as of the latest look at the registry (at most about a
// third of Timing.Refresh old). An instance that crashed counts until its
// entry expires. Safe for concurrent use; it does not block.
func (c *Entry) HeldByOthers(lane string) int {
	p := c.others.Load()
	if p == nil {
		return 0
	}
	n := 0
	for _, info := range *p {
		n += info.Held[lane]
	}
	return n
}

// Others lists the other live instances using Redis, as of the latest look
// at the registry.
func (c *Entry) Others() []Info {
	p := c.others.Load()
	if p == nil {
		return nil
	}
	out := make([]Info, 0, len(*p))
	for _, info := range *p {
		out = append(out, info)
	}
	return out
}

// ID is this instance's id.
func (c *Entry) ID() string { return c.self.ID }

// Lost is the reason the claim cancelled the service, or nil.
func (c *Entry) Lost() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost
}

// Release stops the refreshes and deletes the entry, if still ours, so that
// another instance may start at once. Bounded by a few seconds.
func (c *Entry) Release() {
	c.stop()
	<-c.stopped
	if c.Lost() == nil {
		c.delete()
	}
}

// delete removes the entry; the memory-pacer claim only at our revision.
func (c *Entry) delete() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	var opts []jetstream.KVDeleteOpt
	if c.key == MemoryPacerKey {
		opts = append(opts, jetstream.LastRevision(c.rev))
	}
	if err := c.kv.Delete(ctx, c.key, opts...); err != nil {
		c.log.Warn("deleting the instance entry failed; it expires by itself", "key", c.key, "expires_in", c.timing.TTL.String(), "err", err)
	}
}

func (c *Entry) value() []byte {
	b, _ := json.Marshal(c.self) // plain strings and numbers: cannot fail
	return b
}
