// Package redisbucket keeps GCRA lane states in Redis, so that every throttler
// instance sharing one Redis shares each lane's rate: the bucket.Store for a
// fleet (package bucket has the model and the in-memory store for a single
// instance).
//
// Each lane, and each key of a keyed lane, is one small Redis string holding
// its theoretical arrival time tat. Every change is one Lua script run with
// EVALSHA (EVAL when Redis lost its script cache), so a step of the algorithm
// is atomic across instances, and the script reads the time from Redis TIME:
// the instances' clocks never matter. Keys carry the lane as a hash tag,
// "thr:{lane}:gcra" and "thr:{lane}:k:<key>", so Redis Cluster keeps a lane
// on one slot. A key expires once its bucket is full again: an idle lane
// costs nothing, and an expired key equals a full bucket, never more.
//
// The arithmetic is the pure functions' (bucket.Admit, Reserve, Peek, Pause)
// in whole nanoseconds; results come back as the same bucket.Decision and
// bucket.Reservation, relative to the script's reading of TIME.
//
// Redis losing its data (a restart without persistence, a failover to a
// replica that lagged) must not hand a busy lane a fresh burst. Each Store
// remembers the latest tat it saw per key (its floor) while that tat is
// ahead, and sends it with every call; a script that finds the key missing
// although the floor is still ahead restores the state as an empty bucket no
// earlier than the floor (see Restored), pushed further by the slots that
// the other live instances may hold unstarted (Config.Held, which the
// service fills from the instance registry): no slot that any instance still
// holds is handed out again, so a lane keeps burst + rate·W through the loss,
// at the cost of those slots' worth of capacity once. What stays possible is
// a loss that no calling instance has a floor for: every instance's last
// call to the key lies more than its tat ago, which means the bucket had
// refilled as far as any of them knows.
//
// Every error other than an invalid limit (bucket.ErrInvalidLimit) wraps
// bucket.ErrUnavailable: Redis down or slow, a reply the store does not
// understand, a foreign value under its key. The cause stays reachable with
// errors.Is and errors.As (context.DeadlineExceeded, redis.Error, ...).
package redisbucket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
)

// The store needs of a Redis client only what redis.Script.Run may call:
// go-redis's own redis.Scripter, which *redis.Client, *redis.ClusterClient,
// *redis.Ring and *redis.AutoPipeliner have.
var (
	_ redis.Scripter = (*redis.Client)(nil)
	_ redis.Scripter = (*redis.ClusterClient)(nil)
	_ redis.Scripter = (*redis.Ring)(nil)
	_ redis.Scripter = (*redis.AutoPipeliner)(nil)

	_ bucket.Store = (*Store)(nil)
)

// DefaultPrefix starts every key the store writes.
const DefaultPrefix = "thr"

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 500 * time.Millisecond

// nowTTLSlack is added to every TTL when Config.Now is set: Redis expires
// keys by its own clock, which an injected clock does not move, so a test
// that holds its clock still while real time passes would otherwise see
// states vanish early.
const nowTTLSlack = time.Minute

// maxSpan bounds period·(burst+n) and the pause: past it a time.Duration
// would overflow, so such limits are refused rather than wrapped around.
const maxSpan = float64(math.MaxInt64 / 4)

// Config configures a Store. The zero value is usable: zero fields take the
// defaults of DefaultConfig.
type Config struct {
	// Prefix starts every key ("thr" gives "thr:{lane}:gcra"). It must not
	// contain '{' or '}', which would move the hash tag off the lane.
	Prefix string
	// Timeout bounds each call whose context has no deadline; zero means
	// DefaultTimeout. A deadline bounds the socket reads only when the
	// client was made with ContextTimeoutEnabled; otherwise its ReadTimeout
	// does.
	Timeout time.Duration
	// Clock, for tests only, replaces Redis TIME as the scripts' clock (its
	// Now is passed to them with microsecond.nanosecond precision). Keys then
	// expire a minute later than the bucket refills, since Redis still
	// expires them by its own clock. Leave it nil in production: instances'
	// clocks differ.
	Clock clock.Clock
	// Logger receives a warning each time a lost state is restored (see
	// Store.Restored); nil discards it.
	Logger *slog.Logger
	// Held, when set, tells how many slots of k the other live instances
	// sharing this Redis may hold reserved and not yet started (the sum of
	// their leaky.MaxHeld for the lane). A lost state is restored that many
	// periods later, so that none of those slots is handed out twice. Nil
	// counts none: exact for a single instance. It is called only when a
	// call carries a floor, and must not block.
	Held func(k bucket.Key) int
}

// DefaultConfig returns the production configuration: prefix "thr", a 500ms
// timeout, Redis TIME.
func DefaultConfig() Config {
	return Config{Prefix: DefaultPrefix, Timeout: DefaultTimeout}
}

// Validate reports a configuration error, naming the field.
func (c Config) Validate() error {
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("redisbucket: config: prefix %q: must not contain '{' or '}' (the lane is the hash tag)", c.Prefix)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("redisbucket: config: timeout %v: must not be negative", c.Timeout)
	}
	return nil
}

// Store is the Redis bucket.Store. It is safe for concurrent use, by any
// number of goroutines and instances sharing one Redis. It holds no
// connection of its own: closing the client is the caller's business.
type Store struct {
	client  redis.Scripter
	keyHead string // prefix + ":{"
	timeout time.Duration
	clock   clock.Clock // nil: Redis TIME
	ttlMs   int64       // extra TTL in ms, see nowTTLSlack
	calls   atomic.Uint64
	floors  floors
	log     *slog.Logger
	held    func(k bucket.Key) int
}

// New returns a store that keeps its states through client, a *redis.Client,
// *redis.ClusterClient, *redis.Ring or *redis.AutoPipeliner. It starts
// nothing and sends nothing. Under concurrency the autopipeliner (go-redis's
// client.AutoPipeline(), experimental) sends the calls of many goroutines
// as one pipeline, a round trip and a pair of syscalls for many calls: more
// than twice the admissions per second of a plain client at 64 goroutines
// (docs/BENCHMARKS.md). Every call is still one script run on its own.
// Zero fields of cfg take their defaults; call cfg.Validate first to catch a
// bad prefix.
//
// How fast a call fails while Redis is away is mostly the client's doing.
// With go-redis defaults a call to a stopped server redials until the
// timeout and so takes the whole Timeout; a client made with
// ContextTimeoutEnabled: true, DialerRetries: 1 and MaxRetries: -1 fails at
// once with the cause ("connection refused"), and a server that hangs is then
// cut off at the deadline. go-redis reconnects by itself when Redis is back.
// A script that go-redis retries after a network error may have run twice: a
// token or slots taken twice is capacity lost, never overshoot.
func New(client redis.Scripter, cfg Config) *Store {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{client: client, keyHead: cfg.Prefix + ":{", timeout: cfg.Timeout, clock: cfg.Clock, log: cfg.Logger, held: cfg.Held}
	if cfg.Clock != nil {
		s.ttlMs = nowTTLSlack.Milliseconds()
	}
	return s
}

// Restored is the number of states (a lane's, a key's of a keyed lane)
// found missing although this store had seen their tat ahead of now: Redis
// had lost them (see the package doc), and the script restored each as an
// empty bucket. A call that restored both counts two.
func (s *Store) Restored() uint64 { return s.floors.restored.Load() }

// Key is the Redis key that holds k's state: "<prefix>:{<lane>}:gcra" for a
// lane, "<prefix>:{<lane>}:k:<sub>" for one key of a keyed lane. Braces and
// '%' in the lane name are percent-encoded, so the hash tag is always the
// whole lane and two different keys never share a Redis key.
func (s *Store) Key(k bucket.Key) string {
	lane := k.Lane
	if strings.ContainsAny(lane, "{}%") {
		lane = tagEscaper.Replace(lane)
	}
	if k.Sub == "" {
		return s.keyHead + lane + "}:gcra"
	}
	return s.keyHead + lane + "}:k:" + k.Sub
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// Admit implements bucket.Store: it takes one token if k's bucket has one.
func (s *Store) Admit(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if err := checkLimit(l, 1); err != nil {
		return bucket.Decision{}, err
	}
	key := s.Key(k)
	reply, err := s.run(ctx, admitScript, "admit", k, key, l, 0)
	if err != nil {
		return bucket.Decision{}, err
	}
	allowed, rel, err := parseAdmit(reply)
	if err == nil {
		err = s.see(key, reply, rel)
	}
	if err != nil {
		return bucket.Decision{}, s.fail("admit", k, err)
	}
	// The script decided and changed the state; the pure function, fed the
	// state the script saw, shapes the answer (same integer arithmetic).
	tat := rel
	if allowed {
		tat = rel - l.Period()
	}
	d, _ := bucket.Admit(refTime, refTime.Add(tat), l)
	if d.Allowed != allowed {
		return bucket.Decision{}, s.fail("admit", k, fmt.Errorf("script answered allowed=%v at tat-now=%v, the model %v", allowed, tat, d.Allowed))
	}
	return d, nil
}

// Reserve implements bucket.Store: it reserves n consecutive slots of k in
// one script call (n < 1 counts as 1).
func (s *Store) Reserve(ctx context.Context, k bucket.Key, l bucket.Limit, n int) (bucket.Reservation, error) {
	n = max(n, 1)
	if err := checkLimit(l, n); err != nil {
		return bucket.Reservation{}, err
	}
	key := s.Key(k)
	reply, err := s.run(ctx, reserveScript, "reserve", k, key, l, int64(n))
	if err != nil {
		return bucket.Reservation{}, err
	}
	base, err := parseFirst(reply)
	after := base + time.Duration(n)*l.Period()
	if err == nil {
		err = s.see(key, reply, after)
	}
	if err != nil {
		return bucket.Reservation{}, s.fail("reserve", k, err)
	}
	r, _ := bucket.Reserve(refTime, refTime.Add(base), l, n)
	// The reply's tat is absolute on the script's clock and lies after
	// ahead of the script's now: that now is the reservation's At (left
	// zero, unknown, for a reply without a tat, which the script never
	// sends after taking a slot).
	a, _ := reply.([]any)     // parseFirst checked the shape
	state, _ := a[1].(string) // and see the type and the format
	if tat, ok := parseState(state); ok {
		r.At = time.Unix(0, tat-int64(after)).UTC()
	}
	return r, nil
}

// Peek implements bucket.Store: what Admit would answer, taking nothing.
func (s *Store) Peek(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if err := checkLimit(l, 1); err != nil {
		return bucket.Decision{}, err
	}
	key := s.Key(k)
	reply, err := s.run(ctx, peekScript, "peek", k, key, l, 0)
	if err != nil {
		return bucket.Decision{}, err
	}
	tat, err := parseFirst(reply)
	if err == nil {
		err = s.see(key, reply, tat)
	}
	if err != nil {
		return bucket.Decision{}, s.fail("peek", k, err)
	}
	return bucket.Peek(refTime, refTime.Add(tat), l), nil
}

// Pause implements bucket.Store: no slot of k starts for d from the script's
// now, and the bucket refills from empty after that.
func (s *Store) Pause(ctx context.Context, k bucket.Key, l bucket.Limit, d time.Duration) error {
	if err := checkLimit(l, 1); err != nil {
		return err
	}
	if math.Abs(float64(d)) > maxSpan {
		return fmt.Errorf("%w: pause %v is too long", bucket.ErrInvalidLimit, d)
	}
	key := s.Key(k)
	reply, err := s.run(ctx, pauseScript, "pause", k, key, l, d.Nanoseconds())
	if err != nil {
		return err
	}
	tat, err := parseFirst(reply)
	if err == nil {
		err = s.see(key, reply, tat)
	}
	if err != nil {
		return s.fail("pause", k, err)
	}
	return nil
}

// refTime stands for the script's now when a relative result is handed to
// the pure functions; any instant far from the ends of time.Time will do.
var refTime = time.Unix(1<<32, 0)

// checkLimit validates l, and refuses limits whose spans would overflow a
// time.Duration (tiny rates with a large burst or batch), which
// Limit.Validate lets through.
func checkLimit(l bucket.Limit, n int) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if period := float64(time.Second) / l.Rate; period*(float64(l.Burst)+float64(n)) > maxSpan {
		return fmt.Errorf("%w: rate %v with burst %d and %d slots spans more than %v", bucket.ErrInvalidLimit, l.Rate, l.Burst, n, time.Duration(maxSpan))
	}
	return nil
}

// run runs one script on k's key with the common arguments.
func (s *Store) run(ctx context.Context, script *redis.Script, op string, k bucket.Key, key string, l bucket.Limit, arg int64) (any, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	s.calls.Add(1)
	reply, err := script.Run(ctx, s.client, []string{key}, s.args(k, key, l, arg, 0)...).Result()
	if err != nil {
		return nil, s.fail(op, k, err)
	}
	return reply, nil
}

// args are a script's ARGV[1..7] for k's key (see the prelude), in a slice
// with room for spare more.
func (s *Store) args(k bucket.Key, key string, l bucket.Limit, arg int64, spare int) []any {
	now := ""
	if s.clock != nil {
		now = formatNow(s.clock.Now())
	}
	floor, held := s.floors.get(key), int64(0)
	if floor != "" && s.held != nil {
		held = min(int64(max(s.held(k), 0))*int64(l.Period()), int64(maxSpan))
	}
	return append(make([]any, 0, 7+spare), now, int64(l.Period()), int64(l.Tolerance()), arg, s.ttlMs, floor, held)
}

// fail wraps a failed call: every error of the store other than an invalid
// limit means it could not give an answer, so it wraps bucket.ErrUnavailable
// and keeps the cause for errors.Is and errors.As.
func (s *Store) fail(op string, k bucket.Key, err error) error {
	return fmt.Errorf("redisbucket: %s %s: %w: %w", op, k, bucket.ErrUnavailable, err)
}

// formatNow writes t in the state format: microseconds since the Unix epoch
// with three decimals of nanoseconds.
func formatNow(t time.Time) string {
	// UnixMicro already rounds down (the nanoseconds of a time.Time are
	// never negative), which is what the format wants before 1970 too.
	us := t.UnixMicro()
	ns := t.Nanosecond() % 1000
	b := make([]byte, 0, 24)
	b = strconv.AppendInt(b, us, 10)
	return string(append(b, '.', byte('0'+ns/100), byte('0'+ns/10%10), byte('0'+ns%10)))
}

// errReply reports a reply of a shape the scripts never send.
var errReply = errors.New("unexpected reply")

// parseAdmit reads the admit script's {allowed, tat-now, tat, restored}
// reply; see also see.
func parseAdmit(reply any) (bool, time.Duration, error) {
	a, ok := reply.([]any)
	if !ok || len(a) != 4 {
		return false, 0, fmt.Errorf("%w %T %v, want {allowed, tat-now, tat, restored}", errReply, reply, reply)
	}
	flag, ok := a[0].(int64)
	if !ok || (flag != 0 && flag != 1) {
		return false, 0, fmt.Errorf("%w %T %v as the allowed flag, want 0 or 1", errReply, a[0], a[0])
	}
	d, err := parseDuration(a[1])
	if err != nil {
		return false, 0, err
	}
	return flag == 1, d, nil
}

// parseFirst reads the {ns, tat, restored} reply of the other scripts and
// returns its first element; see also see.
func parseFirst(reply any) (time.Duration, error) {
	a, ok := reply.([]any)
	if !ok || len(a) != 3 {
		return 0, fmt.Errorf("%w %T %v, want {ns, tat, restored}", errReply, reply, reply)
	}
	return parseDuration(a[0])
}

// see reads the common tail of a reply, {…, tat, restored}, and raises k's
// floor to tat. rel is tat − now as the caller computed it, which bounds how
// long the floor matters.
func (s *Store) see(key string, reply any, rel time.Duration) error {
	a, _ := reply.([]any) // the caller checked the shape
	tat, ok := a[len(a)-2].(string)
	if !ok {
		return fmt.Errorf("%w %T %v as the tat, want a string", errReply, a[len(a)-2], a[len(a)-2])
	}
	flag, ok := a[len(a)-1].(int64)
	if !ok || (flag != 0 && flag != 1) {
		return fmt.Errorf("%w %T %v as the restored flag, want 0 or 1", errReply, a[len(a)-1], a[len(a)-1])
	}
	if flag == 1 {
		s.floors.restored.Add(1)
		s.log.Warn("lane state missing in Redis although this instance saw it ahead of now: Redis lost data "+
			"(a restart without persistence, a failover?); restored as an empty bucket", "key", key, "tat", tat)
	}
	if tat == "" {
		return nil
	}
	ns, ok := parseState(tat)
	if !ok {
		return fmt.Errorf("%w %q as the tat, want µs.nnn", errReply, tat)
	}
	s.floors.raise(key, ns, tat, rel)
	return nil
}

// parseDuration reads a number of nanoseconds, sent as a decimal string (an
// integer reply is accepted too), saturating at the ends of time.Duration.
func parseDuration(v any) (time.Duration, error) {
	var f float64
	switch v := v.(type) {
	case string:
		var err error
		if f, err = strconv.ParseFloat(v, 64); err != nil || math.IsNaN(f) {
			return 0, fmt.Errorf("%w %q, want a number of nanoseconds", errReply, v)
		}
	case int64:
		return time.Duration(v), nil
	default:
		return 0, fmt.Errorf("%w %T %v, want a number of nanoseconds", errReply, v, v)
	}
	if f >= math.MaxInt64 { // 2^63: a conversion would wrap
		return math.MaxInt64, nil
	}
	return time.Duration(max(f, math.MinInt64)), nil
}
