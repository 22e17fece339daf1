package ingest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// Fakes of the handler's interfaces: the HTTP layer is tested alone; the
// real queue and store are tested in internal/service. Each counts its
// calls, so that a test proves a refused request reached nothing.

type fakeAdmitter struct{}

func (fakeAdmitter) Decide(_ context.Context, l admission.Lane, _ string) (admission.Decision, error) {
	return admission.Decision{Limit: l.Limit, Remaining: 1, Reset: time.Second}, nil
}

func (a fakeAdmitter) DecideFrom(ctx context.Context, l admission.Lane, _ admission.Peeked, _ time.Time) (admission.Decision, error) {
	return a.Decide(ctx, l, "")
}

func (a fakeAdmitter) DecideN(ctx context.Context, l admission.Lane, key string, n int) ([]admission.Decision, []error) {
	out, errs := make([]admission.Decision, n), make([]error, n)
	for i := range out {
		out[i], errs[i] = a.Decide(ctx, l, key)
	}
	return out, errs
}

func (fakeAdmitter) Refresh(_ context.Context, _ admission.Lane, _ string, d admission.Decision) admission.Decision {
	return d
}

type fakePublisher struct {
	n       atomic.Uint64
	mu      sync.Mutex
	batched []queue.Job
}

func (p *fakePublisher) Publish(context.Context, queue.Job) (queue.PubResult, error) {
	return queue.PubResult{Seq: p.n.Add(1)}, nil
}

// PublishBatch stores every job, except that an id starting with "full-"
// meets a full lane.
func (p *fakePublisher) PublishBatch(_ context.Context, lane string, jobs []queue.Job) ([]queue.BatchResult, error) {
	out := make([]queue.BatchResult, len(jobs))
	for i, j := range jobs {
		if strings.HasPrefix(j.ID, "full-") {
			out[i].Err = fmt.Errorf("lane %s: %w", lane, queue.ErrBacklogFull)
			continue
		}
		p.mu.Lock()
		p.batched = append(p.batched, j)
		p.mu.Unlock()
		out[i].Seq = p.n.Add(1)
	}
	return out, nil
}

func (p *fakePublisher) Ahead(context.Context, string, string, uint64, time.Duration) (int64, error) {
	return 0, nil
}

type fakeLanes struct {
	maxBody  int64
	setLimit atomic.Int64
	// cost and observe are lane demo's caller quota settings.
	cost    int
	observe bool
}

func (d *fakeLanes) Lane(name string) (Lane, bool) {
	if name != "demo" && name != "other" {
		return Lane{}, false
	}
	return Lane{Admission: admission.Lane{Name: name, Limit: bucket.Limit{Rate: 20, Burst: 10}, MaxBacklog: 1000},
		MaxBody: d.maxBody, AdmitWait: time.Millisecond, Cost: map[bool]int{true: d.cost}[name == "demo"], Observe: d.observe && name == "demo"}, true
}

func (d *fakeLanes) Status(context.Context) []api.LaneStatus {
	return []api.LaneStatus{{Name: "demo", Rate: 20, Burst: 10, Target: "POST https://hooks.example/in"}}
}

func (d *fakeLanes) SetLimit(_ context.Context, name string, rate float64, burst int) (api.LaneStatus, error) {
	d.setLimit.Add(1)
	return api.LaneStatus{Name: name, Rate: rate, Burst: burst}, nil
}

type fakeDead struct {
	mu    sync.Mutex
	calls map[string]int
}

func (f *fakeDead) call(op string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[op]++
}

func (f *fakeDead) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeDead) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *fakeDead) letter(lane string, seq uint64) (api.DeadLetter, error) {
	if seq > 10 {
		return api.DeadLetter{}, fmt.Errorf("%w: %s #%d", queue.ErrNotFound, lane, seq)
	}
	return api.DeadLetter{Seq: seq, ID: fmt.Sprintf("job-%d", seq), Lane: lane, Reason: "status", Payload: []byte("secret payload")}, nil
}

func (f *fakeDead) ListDead(_ context.Context, lane string, _ uint64, _ int) ([]api.DeadLetter, error) {
	f.call("list")
	d, _ := f.letter(lane, 1)
	d.Payload = nil
	return []api.DeadLetter{d}, nil
}

func (f *fakeDead) ListDeadPage(ctx context.Context, lane string, after uint64, limit int) (api.DeadLetters, error) {
	dead, err := f.ListDead(ctx, lane, after, limit)
	page := api.DeadLetters{Dead: dead}
	if len(dead) == limit {
		page.NextAfter = dead[len(dead)-1].Seq
	}
	return page, err
}

func (f *fakeDead) GetDead(_ context.Context, lane string, seq uint64) (api.DeadLetter, error) {
	f.call("get")
	return f.letter(lane, seq)
}

func (f *fakeDead) ReplayDead(_ context.Context, lane string, seq uint64, _ queue.ReplayOptions) (api.DeadLetter, error) {
	f.call("replay")
	return f.letter(lane, seq)
}

func (f *fakeDead) ReplayAllDead(context.Context, string, int, uint64) (queue.Replayed, error) {
	f.call("replay_all")
	return queue.Replayed{Replayed: 1}, nil
}

func (f *fakeDead) DeleteDead(_ context.Context, lane string, seq uint64) error {
	f.call("delete")
	_, err := f.letter(lane, seq)
	return err
}

func (f *fakeDead) PurgeDead(context.Context, string) error {
	f.call("purge")
	return nil
}

// testKey is a key whose secret is "secret-<id>".
func testKey(id string, s Scopes) Key {
	return Key{ID: id, SHA256: sha256.Sum256([]byte("secret-" + id)), Scopes: s}
}

// The keys of the route × scope table.
var tableKeys = []Key{
	testKey("admin", Scopes{Admin: true}),
	testKey("read", Scopes{Read: true}),
	testKey("submit", Scopes{Submit: true}),
	testKey("submit-demo", Scopes{SubmitLanes: []string{"demo"}}),
	testKey("submit-other", Scopes{SubmitLanes: []string{"other"}}),
}

type fixture struct {
	h    *Handler
	pub  *fakePublisher
	dir  *fakeLanes
	dead *fakeDead
	logs *testenv.LogBuffer
}

// newFixture builds a handler on fakes; edit changes its Config first.
func newFixture(t testing.TB, edit func(*Config)) *fixture {
	t.Helper()
	f := &fixture{pub: &fakePublisher{}, dir: &fakeLanes{maxBody: 1 << 10}, dead: &fakeDead{}, logs: &testenv.LogBuffer{}}
	cfg := Config{
		Admitter: fakeAdmitter{}, Publisher: f.pub, Lanes: f.dir, DeadLetters: f.dead,
		Metrics: metrics.New(prometheus.NewRegistry()),
		MetricsHandler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "throttler_up 1")
		}),
		Logger: slog.New(slog.NewJSONHandler(f.logs, nil)),
	}
	if edit != nil {
		edit(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	return f
}
