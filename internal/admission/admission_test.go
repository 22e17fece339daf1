package admission_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixedBacklog struct {
	n   int64
	err error
}

func (f *fixedBacklog) Backlog(context.Context, string, time.Duration) (int64, error) {
	return f.n, f.err
}

type downStore struct{}

func (downStore) Peek(context.Context, bucket.Key, bucket.Limit) (bucket.Decision, error) {
	return bucket.Decision{}, bucket.ErrUnavailable
}

// TestDecide: admission looks and takes nothing; the drain's reservations
// are what empty the bucket.
func TestDecide(t *testing.T) {
	ctx := context.Background()
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 20, Burst: 10}, MaxBacklog: 100, MaxWait: 3 * time.Second}
	clock := buckettest.NewClock()
	store := &bucket.Memory{Clock: clock}
	backlog := &fixedBacklog{}
	a, err := admission.New(admission.Config{Store: store, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	// t0: an idle lane has room for its burst, however often it is asked.
	for range 20 {
		d, err := a.Decide(ctx, lane, "")
		if err != nil || !d.Room || d.Remaining != 10 || d.SlotWait != 0 || d.ETA(0) != 0 {
			t.Fatalf("idle lane: %+v %v", d, err)
		}
	}
	// With room for 10, the 9 jobs ahead take 9 of them and this one the
	// tenth: at once; with 10 ahead it waits a period, with 12 three.
	if d, _ := a.Decide(ctx, lane, ""); d.ETA(9) != 0 || d.ETA(10) != 50*time.Millisecond || d.ETA(12) != 150*time.Millisecond {
		t.Fatalf("idle lane: ETA(9) %v, ETA(10) %v, ETA(12) %v, want 0, 50ms, 150ms", d.ETA(9), d.ETA(10), d.ETA(12))
	}
	// The drain reserves the burst: no room, the next free slot 50 ms away;
	// a job with 3 ahead waits 3 periods more.
	if _, err := store.Reserve(ctx, bucket.Key{Lane: "demo"}, lane.Limit, 10); err != nil {
		t.Fatal(err)
	}
	d, err := a.Decide(ctx, lane, "")
	if err != nil || d.Room || d.Remaining != 0 || d.SlotWait != 50*time.Millisecond || d.ETA(3) != 200*time.Millisecond {
		t.Fatalf("after the burst: %+v %v, want no room, slot in 50ms, ETA(3) 200ms", d, err)
	}
	clock.Advance(50 * time.Millisecond)
	if d, _ := a.Decide(ctx, lane, ""); !d.Room || d.Remaining != 1 {
		t.Fatalf("a period later: %+v, want room for one", d)
	}
	// 61 waiting: 3.05 s > max_wait 3 s.
	backlog.n = 61
	_, err = a.Decide(ctx, lane, "")
	var rej *admission.RejectError
	if !errors.As(err, &rej) || !errors.Is(err, admission.ErrBacklogFull) || rej.Field != "max_wait" || rej.RetryAfter != 50*time.Millisecond {
		t.Fatalf("over max_wait: %v", err)
	}
	// 100 waiting: at max_backlog; Retry-After is the time for one to leave.
	lane.MaxWait = 0
	backlog.n = 100
	_, err = a.Decide(ctx, lane, "")
	if !errors.As(err, &rej) || rej.Field != "max_backlog" || rej.RetryAfter != 50*time.Millisecond {
		t.Fatalf("at max_backlog: %v", err)
	}
	if !strings.Contains(rej.Error(), "backlog of 100 jobs is over max_backlog") {
		t.Fatalf("error text %q", rej.Error())
	}
	// 99 waiting: still taken.
	backlog.n = 99
	if d, err := a.Decide(ctx, lane, ""); err != nil || d.Backlog != 99 {
		t.Fatalf("below max_backlog: %+v %v", d, err)
	}
}

func TestStoreDownQueues(t *testing.T) {
	a, _ := admission.New(admission.Config{Store: downStore{}, Backlog: &fixedBacklog{n: 3}})
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 10, Burst: 5}, MaxBacklog: 10}
	d, err := a.Decide(context.Background(), lane, "")
	if err != nil || d.Room || !d.Degraded || d.ETA(3) != 300*time.Millisecond {
		t.Fatalf("store down: %+v %v, want degraded without room, ETA(3) 300ms", d, err)
	}
}

func TestBacklogUnknownStillDecides(t *testing.T) {
	a, _ := admission.New(admission.Config{Store: &bucket.Memory{}, Backlog: &fixedBacklog{err: errors.New("nats away")}})
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 10, Burst: 1}, MaxBacklog: 10}
	if d, err := a.Decide(context.Background(), lane, ""); err != nil || !d.Room {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestNewNeedsStoreAndBacklog(t *testing.T) {
	if _, err := admission.New(admission.Config{Backlog: &fixedBacklog{}}); err == nil {
		t.Fatal("no store accepted")
	}
	if _, err := admission.New(admission.Config{Store: &bucket.Memory{}}); err == nil {
		t.Fatal("no backlog accepted")
	}
}

// staleBacklog answers a cached count when a stale one will do (maxAge > 0)
// and a fresh one otherwise, and counts the fresh reads.
type staleBacklog struct {
	stale, fresh int64
	freshReads   int
}

func (s *staleBacklog) Backlog(_ context.Context, _ string, maxAge time.Duration) (int64, error) {
	if maxAge > 0 {
		return s.stale, nil
	}
	s.freshReads++
	return s.fresh, nil
}

// TestRefusalUsesAFreshCount: a cached count (at most BacklogMaxAge old)
// decides an admission; a refusal is decided on a fresh count, read only
// when the cached one is over max_backlog or max_wait (20/s: 60 jobs are
// exactly the 3 s of max_wait). At the bounds themselves the job is taken.
func TestRefusalUsesAFreshCount(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		maxWait      time.Duration
		stale, fresh int64
		freshReads   int
		refused      string // the field refused, "" for admitted
		backlog      int64  // Decision.Backlog when admitted
	}{
		{"small cached count decides", 3 * time.Second, 5, 500, 0, "", 5},
		{"at max_wait exactly: taken", 3 * time.Second, 60, 500, 0, "", 60},
		{"over max_wait: fresh count admits", 3 * time.Second, 61, 5, 1, "", 5},
		{"over max_wait: fresh count refuses", 3 * time.Second, 61, 61, 1, "max_wait", 0},
		{"at max_backlog: fresh count admits", 0, 100, 7, 1, "", 7},
		{"at max_backlog: fresh count refuses", 0, 100, 100, 1, "max_backlog", 0},
		{"no max_wait: a long wait is no reason", 0, 99, 500, 0, "", 99},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 20, Burst: 10}, MaxBacklog: 100, MaxWait: tc.maxWait}
			b := &staleBacklog{stale: tc.stale, fresh: tc.fresh}
			a, _ := admission.New(admission.Config{Store: &bucket.Memory{Clock: buckettest.NewClock()}, Backlog: b})
			d, err := a.Decide(ctx, lane, "")
			if b.freshReads != tc.freshReads {
				t.Errorf("%d fresh reads, want %d", b.freshReads, tc.freshReads)
			}
			var rej *admission.RejectError
			switch {
			case tc.refused == "" && (err != nil || d.Backlog != tc.backlog):
				t.Errorf("Decide = %+v, %v; want taken with backlog %d", d, err, tc.backlog)
			case tc.refused != "" && (!errors.As(err, &rej) || rej.Field != tc.refused):
				t.Errorf("Decide = %+v, %v; want refused on %s", d, err, tc.refused)
			}
		})
	}
}

// TestBacklogUnknownIsLogged: an unreadable backlog is said in the log, and
// only then.
func TestBacklogUnknownIsLogged(t *testing.T) {
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 10, Burst: 1}, MaxBacklog: 10}
	for _, tc := range []struct {
		err  error
		want bool
	}{{nil, false}, {errors.New("nats away"), true}} {
		var logs strings.Builder
		a, _ := admission.New(admission.Config{Store: &bucket.Memory{}, Backlog: &fixedBacklog{err: tc.err},
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if _, err := a.Decide(context.Background(), lane, ""); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "backlog unknown"); got != tc.want {
			t.Errorf("backlog error %v: logged %v, want %v:\n%s", tc.err, got, tc.want, logs.String())
		}
	}
}

// TestDecideN: a batch is decided as if its jobs came one after the other:
// room for the bucket's burst, then queued, then refused at max_backlog.
func TestDecideN(t *testing.T) {
	ctx := context.Background()
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 20, Burst: 3}, MaxBacklog: 5}
	store := &bucket.Memory{Clock: buckettest.NewClock()}
	backlog := &fixedBacklog{n: 1}
	a, err := admission.New(admission.Config{Store: store, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	out, errs := a.DecideN(ctx, lane, "", 6)
	for i, want := range []struct {
		room      bool
		remaining int
		backlog   int64
		refused   bool
	}{{true, 3, 1, false}, {true, 2, 2, false}, {true, 1, 3, false}, {false, 0, 4, false}, {refused: true}, {refused: true}} {
		var rej *admission.RejectError
		if want.refused {
			if !errors.As(errs[i], &rej) || rej.Field != "max_backlog" || rej.Backlog != int64(i+1) {
				t.Errorf("job %d: %v, want refused at max_backlog with backlog %d", i, errs[i], i+1)
			}
			continue
		}
		d := out[i]
		wantWait := time.Duration(0)
		if !want.room {
			wantWait = 50 * time.Millisecond // the first job after the burst
		}
		if errs[i] != nil || d.Room != want.room || d.Remaining != want.remaining || d.Backlog != want.backlog || d.SlotWait != wantWait {
			t.Errorf("job %d: %+v %v, want room=%v remaining=%d backlog=%d", i, d, errs[i], want.room, want.remaining, want.backlog)
		}
	}
	if out, errs := a.DecideN(ctx, lane, "", 0); len(out) != 0 || len(errs) != 0 {
		t.Fatalf("empty batch: %v %v", out, errs)
	}
	// No room at all: the first job waits for the next free slot, each
	// one after it a period more.
	if _, err := store.Reserve(ctx, bucket.Key{Lane: "demo"}, lane.Limit, 3); err != nil {
		t.Fatal(err)
	}
	backlog.n = 0
	out, _ = a.DecideN(ctx, lane, "", 3)
	for i, d := range out {
		if d.Room || d.SlotWait != time.Duration(i+1)*50*time.Millisecond {
			t.Errorf("no room, job %d: %+v, want SlotWait %v", i, d, time.Duration(i+1)*50*time.Millisecond)
		}
	}
	backlog.n = 5
	if _, errs := a.DecideN(ctx, lane, "", 2); !errors.Is(errs[0], admission.ErrBacklogFull) || !errors.Is(errs[1], admission.ErrBacklogFull) {
		t.Fatalf("full lane: %v", errs)
	}
}

// TestDecideNMaxWait: within a batch, max_wait refuses the first job whose
// wait behind the backlog and the jobs before it is over the bound (a wait
// of exactly max_wait is taken), and every job after it.
func TestDecideNMaxWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// 50 ms a job; max_wait is two jobs' worth.
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 20, Burst: 1}, MaxBacklog: 100, MaxWait: 100 * time.Millisecond}
	a, err := admission.New(admission.Config{Store: &bucket.Memory{Clock: buckettest.NewClock()}, Backlog: &fixedBacklog{n: 1}})
	if err != nil {
		t.Fatal(err)
	}
	out, errs := a.DecideN(ctx, lane, "", 4)
	for i := range 2 { // backlog 1 and 2: waits of 50 and 100 ms
		if errs[i] != nil || out[i].Backlog != int64(i+1) {
			t.Errorf("job %d: %+v %v, want taken with backlog %d", i, out[i], errs[i], i+1)
		}
	}
	for i := 2; i < 4; i++ { // waits of 150 and 200 ms
		var rej *admission.RejectError
		wantRetry := time.Duration(i-1) * 50 * time.Millisecond
		if !errors.As(errs[i], &rej) || rej.Field != "max_wait" || rej.Backlog != int64(i+1) || rej.RetryAfter != wantRetry {
			t.Errorf("job %d: %+v, want refused at max_wait with backlog %d, retry after %v", i, errs[i], i+1, wantRetry)
		}
	}
}

// TestDecideNRetryAfter: a job refused at max_backlog is told to come back
// when the lane has drained down to room for it: one period per job over
// the bound, itself included.
func TestDecideNRetryAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 20, Burst: 1}, MaxBacklog: 3}
	a, err := admission.New(admission.Config{Store: &bucket.Memory{Clock: buckettest.NewClock()}, Backlog: &fixedBacklog{n: 2}})
	if err != nil {
		t.Fatal(err)
	}
	_, errs := a.DecideN(ctx, lane, "", 3)
	if errs[0] != nil {
		t.Fatalf("job 0 refused: %v", errs[0])
	}
	for i := 1; i < 3; i++ {
		var rej *admission.RejectError
		want := time.Duration(i) * 50 * time.Millisecond
		if !errors.As(errs[i], &rej) || rej.Field != "max_backlog" || rej.RetryAfter != want {
			t.Errorf("job %d: %+v, want refused at max_backlog, retry after %v", i, errs[i], want)
		}
	}
}

// subDownStore is a store whose per-key states cannot be read (the lane's
// can) while down is set.
type subDownStore struct {
	*bucket.Memory
	down bool
}

func (s *subDownStore) Peek(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if s.down && k.Sub != "" {
		return bucket.Decision{}, bucket.ErrUnavailable
	}
	return s.Memory.Peek(ctx, k, l)
}

// TestKeyedLane: on a keyed lane a job has room only when both its key's
// bucket and the lane's have, with the fewer remaining and the later next
// slot of the two; without a key only the lane's state counts. A key's
// state that cannot be read degrades like the lane's, and Refresh then
// leaves the decision as it was.
func TestKeyedLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keyLimit := bucket.Limit{Rate: 1, Burst: 2}
	lane := admission.Lane{Name: "demo", Limit: bucket.Limit{Rate: 10, Burst: 5}, MaxBacklog: 100, KeyLimit: &keyLimit}
	clk := buckettest.NewClock()
	mem := &bucket.Memory{Clock: clk}
	store := &subDownStore{Memory: mem}
	a, err := admission.New(admission.Config{Store: store, Backlog: &fixedBacklog{}})
	if err != nil {
		t.Fatal(err)
	}
	laneKey, key := bucket.Key{Lane: "demo"}, bucket.Key{Lane: "demo", Sub: "k"}
	check := func(what, sub string, room bool, remaining int, slotWait time.Duration) admission.Decision {
		t.Helper()
		d, err := a.Decide(ctx, lane, sub)
		if err != nil || d.Room != room || d.Remaining != remaining || d.SlotWait != slotWait || d.Degraded {
			t.Fatalf("%s: %+v %v, want room=%v remaining=%d slot wait %v", what, d, err, room, remaining, slotWait)
		}
		return d
	}
	check("both idle", "k", true, 2, 0) // the key's burst is the smaller
	check("no key", "", true, 5, 0)
	// The key's bucket empty: no room for its jobs, the next slot a second away.
	if _, err := mem.Reserve(ctx, key, keyLimit, 2); err != nil {
		t.Fatal(err)
	}
	check("key empty", "k", false, 0, time.Second)
	check("key empty, no key", "", true, 5, 0)
	// The lane's bucket empty too, its next slot sooner than the key's.
	if _, err := mem.Reserve(ctx, laneKey, lane.Limit, 5); err != nil {
		t.Fatal(err)
	}
	d := check("both empty", "k", false, 0, time.Second)
	// Only the lane's empty: another key has room in its own bucket.
	check("lane empty", "other", false, 0, 100*time.Millisecond)

	store.down = true
	if d, err := a.Decide(ctx, lane, "k"); err != nil || d.Room || !d.Degraded {
		t.Fatalf("key state unreadable: %+v %v, want degraded without room", d, err)
	}
	if got := a.Refresh(ctx, lane, "k", d); got != d {
		t.Fatalf("Refresh with the key state unreadable = %+v, want %+v unchanged", got, d)
	}
	store.down = false
	clk.Advance(time.Second)
	if got := a.Refresh(ctx, lane, "k", d); !got.Room || got.SlotWait != 0 || got.Remaining != 1 {
		t.Fatalf("Refresh a second later = %+v, want room for one", got)
	}
}

// countingPeeker counts the peeks that reach the store.
type countingPeeker struct {
	admission.Peeker
	n int
}

func (c *countingPeeker) Peek(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	c.n++
	return c.Peeker.Peek(ctx, k, l)
}

// TestDecideFrom: a fresh peek made elsewhere (with the caller quotas)
// decides without a call to the store, its waits shortened by its age; an
// old one, one whose free slot has come since, or one for a keyed lane is
// read again; the backlog bounds hold as in Decide.
func TestDecideFrom(t *testing.T) {
	ctx := context.Background()
	lim := bucket.Limit{Rate: 20, Burst: 10}
	lane := admission.Lane{Name: "from", Limit: lim, MaxBacklog: 100}
	clock := buckettest.NewClock()
	mem := &bucket.Memory{Clock: clock}
	store := &countingPeeker{Peeker: mem}
	backlog := &fixedBacklog{}
	a, err := admission.New(admission.Config{Store: store, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Reserve(ctx, bucket.Key{Lane: "from"}, lim, 10); err != nil {
		t.Fatal(err)
	}
	p, err := mem.Peek(ctx, bucket.Key{Lane: "from"}, lim)
	if err != nil || p.Allowed || p.RetryAfter != 50*time.Millisecond {
		t.Fatalf("peek after the burst: %+v %v", p, err)
	}
	at := time.Unix(1000, 0)
	steps := []struct {
		name     string
		lane     admission.Lane
		peek     bucket.Decision
		age      time.Duration
		peeks    int // calls that reach the store
		room     bool
		slotWait time.Duration
	}{
		{"fresh", lane, p, 0, 0, false, 50 * time.Millisecond},
		{"aged 20ms", lane, p, 20 * time.Millisecond, 0, false, 30 * time.Millisecond},
		{"slot came since", lane, p, 50 * time.Millisecond, 1, false, 50 * time.Millisecond},
		{"exactly PeekMaxAge", lane, bucket.Decision{Allowed: true, Remaining: 3}, admission.PeekMaxAge, 0, true, 0},
		{"older than PeekMaxAge", lane, bucket.Decision{Allowed: true, Remaining: 3}, admission.PeekMaxAge + time.Millisecond, 1, false, 50 * time.Millisecond},
		{"from the future", lane, bucket.Decision{Allowed: true, Remaining: 3}, -time.Millisecond, 1, false, 50 * time.Millisecond},
		{"room", lane, bucket.Decision{Allowed: true, Remaining: 3}, 10 * time.Millisecond, 0, true, 0},
		{"keyed lane", admission.Lane{Name: "from", Limit: lim, MaxBacklog: 100, KeyLimit: &lim}, bucket.Decision{Allowed: true, Remaining: 3}, 0, 1, false, 50 * time.Millisecond},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			store.n = 0
			d, err := a.DecideFrom(ctx, s.lane, admission.Peeked{D: s.peek, At: at}, at.Add(s.age))
			if err != nil || store.n != s.peeks || d.Room != s.room || d.SlotWait != s.slotWait {
				t.Fatalf("%+v %v after %d peeks; want room %v, slot wait %v after %d peeks", d, err, store.n, s.room, s.slotWait, s.peeks)
			}
		})
	}
	// The bucket is full again later by the peek's age.
	if d, err := a.DecideFrom(ctx, lane, admission.Peeked{D: bucket.Decision{Allowed: true, Remaining: 3, ResetAfter: 100 * time.Millisecond}, At: at}, at.Add(20*time.Millisecond)); err != nil || d.Reset != 80*time.Millisecond {
		t.Fatalf("a peek aged 20ms with the bucket full in 100ms: %+v %v, want Reset 80ms", d, err)
	}
	// The backlog bounds refuse as Decide does, whatever the peek says.
	backlog.n = 100
	_, err = a.DecideFrom(ctx, lane, admission.Peeked{D: bucket.Decision{Allowed: true}, At: at}, at)
	var rej *admission.RejectError
	if !errors.As(err, &rej) || rej.Field != "max_backlog" {
		t.Fatalf("at max_backlog: %v", err)
	}
}
