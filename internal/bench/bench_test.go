package bench

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 50, 3 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 100, 5 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 0, 1 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9 * time.Millisecond},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", tc.in, tc.p, got, tc.want)
		}
	}
}

func TestPacingOf(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, v := range ms {
			out = append(out, t0.Add(time.Duration(v)*time.Millisecond))
		}
		return out
	}
	t.Run("even", func(t *testing.T) {
		var ms []int
		for i := range 21 {
			ms = append(ms, i*100)
		}
		p := pacingOf(at(ms...), 100*time.Millisecond)
		if p.Dev.Max != 0 || p.MaxPerSecond != 10 || p.Achieved != 10 || p.N != 21 {
			t.Fatalf("got %+v, want no deviation, 10 per second, 10/s", p)
		}
	})
	t.Run("clump", func(t *testing.T) {
		// Unsorted on purpose: a clump of three at 1000 ms.
		p := pacingOf(at(1000, 0, 100, 1000, 1000, 200), 100*time.Millisecond)
		if p.MaxPerSecond != 5 { // [100, 1100) holds 100, 200 and the clump
			t.Fatalf("MaxPerSecond = %d, want 5", p.MaxPerSecond)
		}
		if p.Dev.Max != 700*time.Millisecond {
			t.Fatalf("Dev.Max = %v, want 700ms (gap 800ms)", p.Dev.Max)
		}
		if p.Span != time.Second || p.Achieved != 5 {
			t.Fatalf("Span %v Achieved %v, want 1s and 5/s", p.Span, p.Achieved)
		}
	})
	t.Run("window is half-open", func(t *testing.T) {
		if got := maxInWindow(at(0, 999, 1000, 1999), time.Second); got != 2 {
			t.Fatalf("maxInWindow = %d, want 2", got)
		}
	})
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmtInt(0), "0"},
		{fmtInt(999), "999"},
		{fmtInt(1000), "1,000"},
		{fmtInt(-1234567), "-1,234,567"},
		{fmtRate(97.34), "97.3/s"},
		{fmtRate(12345.6), "12,346/s"},
		{fmtDur(850 * time.Microsecond), "850 µs"},
		{fmtDur(4120 * time.Microsecond), "4.12 ms"},
		{fmtDur(15 * time.Millisecond), "15.0 ms"},
		{fmtDur(2500 * time.Millisecond), "2.50 s"},
		{fmtRatio(3, 2), "1.50×"},
		{fmtRatio(3, 0), "—"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestConfigRefusesNonLoopback(t *testing.T) {
	for _, c := range []Config{
		{RedisURL: "redis://10.0.0.5:6379/0"},
		{RedisURL: "redis://redis.example.com:6379"},
		{NATSURL: "nats://192.168.1.2:4222"},
		{NATSURL: "http://127.0.0.1:4222"},
		{Only: []string{"everything"}},
		{Keys: []int{1000, 0}},
		{Keys: []int{maxKeys + 1}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	for _, c := range []Config{
		{RedisURL: "redis://127.0.0.1:6379/0", NATSURL: "nats://localhost:4222"},
		{NATSURL: "nats://[::1]:4222", Only: []string{Pacing}},
		{Only: []string{Keyed}, Keys: []int{1, 10_000, maxKeys}},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", c, err)
		}
	}
}

// TestKeyedLaneConfig: the generated config of the keyed scenario loads as a
// keyed lane with its per_key limits, and the key counts default by mode.
func TestKeyedLaneConfig(t *testing.T) {
	o := svcOpts{dataDir: t.TempDir(), target: "http://127.0.0.1:9/hook", lanes: map[string]laneOpts{
		"k": {rate: 1_000_000, burst: 1, inflight: 64, backlog: 10, perKey: &perKeyOpts{rate: 0.5, burst: 3}},
		"u": {rate: 10, burst: 1, inflight: 4, backlog: 10},
	}}
	cfg, err := config.Parse("generated", o.yaml(), nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, o.yaml())
	}
	for _, l := range cfg.Lanes {
		switch l.Name {
		case "k":
			if l.PerKey == nil || l.PerKey.Rate.PerSecond() != 0.5 || l.PerKey.Burst != 3 || l.PerKey.MaxInflight != 64 {
				t.Errorf("lane k: per_key %+v, want rate 0.5/s, burst 3, max_inflight 64 (the lane's)", l.PerKey)
			}
		case "u":
			if l.PerKey != nil {
				t.Errorf("lane u is keyed: %+v", l.PerKey)
			}
		}
	}
	if got := (Config{}).keys(); !slices.Equal(got, []int{1_000, 10_000, 100_000}) {
		t.Errorf("default keys %v", got)
	}
	if got := (Config{Smoke: true, Keys: []int{7}}).keys(); !slices.Equal(got, []int{7}) {
		t.Errorf("keys %v, want [7]", got)
	}
}

// TestCPUTime reads this process's CPU time, which grows while it works.
func TestCPUTime(t *testing.T) {
	before, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		for i := range 100_000 {
			x ^= i
		}
	}
	after, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// 300 ms of wall time spinning: some CPU time, never more than the
	// wall time on every CPU.
	if d := after - before; d <= 0 || d > time.Duration(runtime.NumCPU())*time.Second {
		t.Fatalf("CPU time grew by %v over 300 ms of work (x %d)", d, x)
	}
	if _, err := cpuTime(1 << 30); err == nil {
		t.Fatal("cpuTime of a process that cannot exist: no error")
	}
}

// TestSelfCPU: getrusage's figure for this process grows while it works,
// by less than a tick of /proc's when the work is short.
func TestSelfCPU(t *testing.T) {
	before, err := selfCPU()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 3*time.Millisecond; {
		for i := range 10_000 {
			x ^= i
		}
	}
	after, err := selfCPU()
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d <= 0 || d > time.Duration(runtime.NumCPU())*time.Second {
		t.Fatalf("CPU time grew by %v over 3 ms of work (x %d)", d, x)
	}
}

// TestSinkFirstByKey: the sink keeps each Throttle-Key's first arrival.
func TestSinkFirstByKey(t *testing.T) {
	sk, err := startSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sk.close()
	c := newClient(1)
	defer c.CloseIdleConnections()
	send := func(key string) {
		req, _ := http.NewRequest(http.MethodPost, sk.URL, strings.NewReader("x"))
		if key != "" {
			req.Header.Set("Throttle-Key", key)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send("a")
	first, ok := sk.first("a")
	send("a")
	send("")
	if again, _ := sk.first("a"); !ok || !again.Equal(first) {
		t.Fatalf("first(a) = %v, %v; then %v", first, ok, again)
	}
	if _, ok := sk.first("b"); ok {
		t.Fatal("first(b) without a job of b")
	}
	if sk.count.Load() != 3 {
		t.Fatalf("count %d, want 3", sk.count.Load())
	}
	sk.reset(0)
	if _, ok := sk.first("a"); ok {
		t.Fatal("reset kept first(a)")
	}
}

// TestSmoke runs the smoke mode of two scenarios end to end against the
// real service and checks that they produce their rows and a table.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service")
	}
	t.Parallel() // its rows, not their figures: nothing here is timed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rows, err := Run(ctx, Config{Smoke: true, Only: []string{Pacing, Latency}, Duration: 200 * time.Millisecond,
		Progress: &progress, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// Two rows per rate, and the 10,000/s lane again with a burst.
	want := map[string]int{Pacing: 2*len(pacingRates) + 1, Latency: 1}
	got := map[string]int{}
	for _, r := range rows {
		if r.Verdict == Failed {
			t.Errorf("%s: %s", r.Scenario, r.Note)
		}
		if r.Ours == "" || r.Goal == "" {
			t.Errorf("row %+v lacks a figure or a goal", r)
		}
		got[r.ID]++
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("%d rows for %s, want %d", got[id], id, n)
		}
	}
	var table bytes.Buffer
	PrintTable(&table, rows)
	if !strings.Contains(table.String(), "| scenario") || !strings.Contains(table.String(), "pacing @10,000/s") ||
		!strings.Contains(table.String(), "pacing @10,000/s, burst 100") {
		t.Errorf("table:\n%s", table.String())
	}
	if !strings.Contains(progress.String(), "[1/2] pacing") {
		t.Errorf("progress:\n%s", progress.String())
	}
}

// TestIngestSmoke runs the intake rows with tiny counts: every side of
// them (ours, the no-op and durable floors, the batch reference behind
// HTTP, the native publishes) answers, and each row names its reference
// and, on Linux, the CPU per job of both sides.
func TestIngestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service")
	}
	t.Parallel() // its rows, not their figures: nothing here is timed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rows, err := Run(ctx, Config{Smoke: true, Only: []string{Ingest}, Duration: 200 * time.Millisecond,
		Progress: io.Discard, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	wants := []string{"no-op handler", "js.Publish + Nats-Msg-Id", "js.Publish ×64", "2 Throttle-Forward headers (vs without)", "handler that stores them with js.PublishAsync", "js.PublishAsync, windows"}
	if len(rows) != len(wants) {
		t.Fatalf("%d ingest rows, want %d: %+v", len(rows), len(wants), rows)
	}
	for i, r := range rows {
		if !strings.Contains(r.Scenario, wants[i]) {
			t.Errorf("row %d is %q, want one against %q", i, r.Scenario, wants[i])
		}
		if r.Ours == "" || r.Reference == "" || r.Ratio == "" || r.Ratio == "—" {
			t.Errorf("row %q lacks a figure: %+v", r.Scenario, r)
		}
		if strings.Contains(r.Note, "failed") {
			t.Errorf("row %q: %s", r.Scenario, r.Note)
		}
		if runtime.GOOS == "linux" && !strings.Contains(r.Note, "CPU per job") {
			t.Errorf("row %q has no CPU per job: %q", r.Scenario, r.Note)
		}
	}
}

// TestMedianDuration: the CPU per job of the tracing row is the median of
// each side's runs; a run whose CPU time could not be read voids it.
func TestMedianDuration(t *testing.T) {
	for _, step := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3}, 3},
		{[]time.Duration{9, 1, 5}, 5},
		{[]time.Duration{9, 1, 5, 7}, 5},
		{[]time.Duration{9, 0, 5}, 0},
	} {
		if got := medianDuration(step.in); got != step.want {
			t.Errorf("medianDuration(%v) = %v, want %v", step.in, got, step.want)
		}
	}
}

// TestQuantileBound: the bucket bound of a quantile of the observations
// between two reads of a histogram; NaN for none.
func TestQuantileBound(t *testing.T) {
	bounds := []float64{0.001, 0.002, 0.004, math.Inf(1)}
	for _, step := range []struct {
		name          string
		before, after []uint64
		q, want       float64
	}{
		{"all in the first bucket", []uint64{0, 0, 0, 0}, []uint64{100, 100, 100, 100}, 0.99, 0.001},
		{"the tail in the third", []uint64{0, 0, 0, 0}, []uint64{90, 98, 100, 100}, 0.99, 0.004},
		{"past the last bound", nil, []uint64{90, 90, 90, 100}, 0.99, math.Inf(1)},
		{"only what came after before", []uint64{50, 50, 50, 50}, []uint64{50, 150, 150, 150}, 0.99, 0.002},
		{"nothing between the reads", []uint64{5, 5, 5, 5}, []uint64{5, 5, 5, 5}, 0.99, math.NaN()},
		{"unreadable", nil, nil, 0.99, math.NaN()},
	} {
		t.Run(step.name, func(t *testing.T) {
			got := quantileBound(bounds, step.before, step.after, step.q)
			if got != step.want && !(math.IsNaN(got) && math.IsNaN(step.want)) {
				t.Fatalf("quantileBound = %v, want %v", got, step.want)
			}
		})
	}
}

// TestRecordsSmoke runs the job records rows with tiny counts: every row
// has a figure, none failed (the drain row failed when its lanes, raised
// from 1/s, kept their slots a second apart: 12 of 500 jobs in 11 s; and
// when its lanes, held and resumed at bucket.MaxRate, gave up every slot
// during the checks before each start: leaky
// TestChecksSlowerThanAPeriodStillStart), and the GET row names its
// /healthz reference. It runs under the race detector too.
func TestRecordsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service")
	}
	t.Parallel() // its rows, not their figures: nothing here is timed
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rows, err := Run(ctx, Config{Smoke: true, Only: []string{Records}, Duration: 200 * time.Millisecond, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 6: %+v", len(rows), rows)
	}
	for _, r := range rows {
		if r.Verdict == Failed || r.Verdict == Skipped && !strings.Contains(r.Scenario, "RSS") {
			t.Errorf("%s: %s %s", r.Scenario, r.Verdict, r.Note)
		}
		if r.Ours == "" {
			t.Errorf("row %q has no figure: %s", r.Scenario, r.Note)
		}
	}
	if r := rows[2]; !strings.Contains(r.Scenario, "/healthz") || r.Reference == "—" || r.Reference == "" {
		t.Errorf("GET row without its /healthz reference: %+v", r)
	}
}

func TestMedianFloat(t *testing.T) {
	for _, step := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{9, 1, 5, 7}, 6},
		{[]float64{0.84, 1.2, 1.02, 0.98}, 1},
	} {
		if got := medianFloat(step.in); got != step.want {
			t.Errorf("medianFloat(%v) = %v, want %v", step.in, got, step.want)
		}
	}
}

// TestDrainDestSmoke runs the destination row with tiny counts: the
// warm-up and the smokePairs pairs drain, in ABBA order, and the row's ratio is
// the median of the pairs' ratios, each listed in the note.
func TestDrainDestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service")
	}
	t.Parallel() // its rows, not their figures: nothing here is timed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Duration bounds each drain's wait (twice it, plus a millisecond a
	// job): 5 s, so that a loaded machine slows the test without failing
	// it; the drains take far less when they can.
	e, err := newEnv(Config{Smoke: true, Duration: 5 * time.Second, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	sk, err := startSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sk.close()
	row, err := e.drainDest(ctx, sk, 200)
	if err != nil {
		t.Fatal(err)
	}
	if row.Verdict == Failed || !strings.HasSuffix(row.Ratio, "×") || !strings.Contains(row.Ours, "median of "+strconv.Itoa(smokePairs)) {
		t.Errorf("row %+v", row)
	}
	// Each pair shows both sides' CPU per job. The row's own CPU figures
	// (medians) are left out when a side read none: a smoke drain of 90
	// counted jobs can fit in one tick of the process's CPU clock.
	if n := strings.Count(row.Note, " CPU/job)"); runtime.GOOS == "linux" && n != smokePairs {
		t.Errorf("the note shows CPU per job for %d pairs, want %d: %+v", n, smokePairs, row)
	}
	if n := strings.Count(row.Note, " = "); n != smokePairs {
		t.Errorf("the note lists %d pairs, want %d: %s", n, smokePairs, row.Note)
	}
}
