// Package bench is the load tool behind `throttler-bench`: it measures the
// throttler end to end against the engine's own limits and against peer
// libraries, in one run on one machine, and prints one table that pairs each
// of our figures with a reference measured in the same run.
//
// Scenarios (select with Config.Only):
//
//   - ingest: HTTP POST /v1/lanes/{lane}/jobs at 64 connections, accepted
//     jobs/s and p50/p99, against raw nats.go JetStream publishes from 64
//     goroutines to the same server.
//   - admission: admission decisions/s over the Redis store against
//     go-redis/redis_rate Allow on the same Redis, 64 goroutines each.
//   - drain: one lane draining a prefilled backlog into a local sink against
//     a raw JetStream fetch+ack loop, and the Redis calls per drained job at
//     1,000 jobs/s.
//   - pacing: |gap − period| and the busiest 1-s window at 100, 1,000 and
//     10,000 jobs/s, at the sink, against go.uber.org/ratelimit Take().
//   - latency: an admitted job, HTTP in → target, at 1,000 jobs/s, against a
//     direct POST to the same target.
//   - peers: nginx limit_req in delay mode in front of the same sink, at the
//     same rate with the same jobs as one of our lanes.
//   - rss: the resident memory of a throttler process (the real binary)
//     holding a 1,000,000-job backlog, with embedded and with external NATS.
//   - lanes: a throttler process with 100 and with 1,000 idle lanes: the
//     time until it is ready, its resident memory with external NATS, and
//     the JetStream streams, consumers and memory those lanes take.
//   - keyed: a keyed lane (per_key) of a throttler process (the real
//     binary, on a nats-server of the bench's own) draining 1,000, 10,000
//     and 100,000 keys with backlog into the sink, against one key: jobs/s,
//     the process's CPU per job, its RSS, Redis memory per active and per
//     idle key; and the delay of a cold key's first job behind a hot key's
//     100,000-job backlog.
//
// The service runs in-process (service.New + Run) with a generated config:
// embedded NATS in a temporary directory unless Config.NATSURL is set, Redis
// from Config.RedisURL or a redis-server started on a free loopback port
// (Redis rows are skipped when neither is available), and a sink on
// 127.0.0.1 that records arrivals. Only loopback addresses are ever
// contacted, and every loop is bounded in count and in time.
//
// A Run is not safe for concurrent use with another Run in the same process
// (the figures would disturb each other), although nothing would break.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Scenario ids, the values Config.Only accepts.
const (
	Ingest    = "ingest"
	Admission = "admission"
	Drain     = "drain"
	Pacing    = "pacing"
	Latency   = "latency"
	RSS       = "rss"
	Peers     = "peers"
	Lanes     = "lanes"
	Keyed     = "keyed"
	Records   = "records"
)

// Scenarios lists every scenario id in the order they run.
var Scenarios = []string{Ingest, Admission, Drain, Pacing, Latency, RSS, Peers, Lanes, Keyed, Records}

// Config configures a Run. The zero value runs every scenario in full mode
// with embedded NATS and a redis-server of its own (when one is on PATH).
type Config struct {
	// Smoke runs every loop with tiny counts: it proves the scenarios work
	// and print, not how fast anything is. Goals are shown but not meant to
	// be enforced.
	Smoke bool
	// Only restricts the run to these scenario ids; empty runs all.
	Only []string
	// RedisURL is a Redis to use (loopback only); empty starts a
	// redis-server on a free 127.0.0.1 port when the binary is on PATH.
	RedisURL string
	// NATSURL is a NATS server with JetStream to use (loopback only); empty
	// runs the service's embedded server.
	NATSURL string
	// Replicas is the services' nats.replicas on NATSURL (a JetStream
	// cluster: 3 compares R3 with R1); zero means 1.
	Replicas int
	// Duration caps each timed measurement loop; zero means 5s (500ms in
	// smoke mode). Count-bounded loops also stop at a deadline derived
	// from it.
	Duration time.Duration
	// Backlog is the backlog of the rss scenario; zero means 1,000,000
	// (10,000 in smoke mode).
	Backlog int
	// Keys are the key counts of the keyed scenario; empty means 1,000,
	// 10,000 and 100,000 (100 in smoke mode). One key always runs too, as
	// the reference.
	Keys []int
	// Binary is the throttler executable the rss scenario starts with
	// `serve --config FILE`; empty skips that scenario.
	Binary string
	// Progress receives the progress bar (a terminal) or progress lines;
	// nil discards them.
	Progress io.Writer
	// TempDir is where data directories go; empty uses os.TempDir.
	TempDir string
}

// Verdict says whether a row met its goal.
type Verdict string

// Verdicts.
const (
	Met     Verdict = "yes"
	Missed  Verdict = "NO"
	NoGoal  Verdict = "—"
	Skipped Verdict = "skipped"
	Failed  Verdict = "error"
)

// Result is one row of the table.
type Result struct {
	// ID is the scenario id the row belongs to.
	ID string
	// Scenario names what was measured.
	Scenario string
	// Ours and Reference are the figures, formatted.
	Ours, Reference string
	// Ratio compares them in the direction of the goal ("1.73×"), or "—".
	Ratio string
	// Goal states the target.
	Goal string
	// Verdict says whether the goal was met.
	Verdict Verdict
	// Note is the reason of a skip or an error, or a remark.
	Note string
}

func (c Config) duration() time.Duration {
	switch {
	case c.Duration > 0:
		return c.Duration
	case c.Smoke:
		return 500 * time.Millisecond
	}
	return 5 * time.Second
}

func (c Config) backlog() int {
	switch {
	case c.Backlog > 0:
		return c.Backlog
	case c.Smoke:
		return 10_000
	}
	return 1_000_000
}

func (c Config) keys() []int {
	switch {
	case len(c.Keys) > 0:
		return c.Keys
	case c.Smoke:
		return []int{100}
	}
	return []int{1_000, 10_000, 100_000}
}

// Validate checks the configuration: known scenario ids, loopback URLs.
func (c Config) Validate() error {
	for _, id := range c.Only {
		if !slices.Contains(Scenarios, id) {
			return fmt.Errorf("bench: only: unknown scenario %q (one of %s)", id, strings.Join(Scenarios, ", "))
		}
	}
	if c.RedisURL != "" {
		if err := loopbackURL(c.RedisURL, "redis", "rediss"); err != nil {
			return fmt.Errorf("bench: redis-url: %w", err)
		}
	}
	if c.NATSURL != "" {
		if err := loopbackURL(c.NATSURL, "nats"); err != nil {
			return fmt.Errorf("bench: nats-url: %w", err)
		}
	}
	if c.Duration < 0 || c.Backlog < 0 {
		return errors.New("bench: duration and backlog must not be negative")
	}
	for _, n := range c.Keys {
		if n < 1 || n > maxKeys {
			return fmt.Errorf("bench: keys: %d: must be between 1 and %s", n, fmtInt(maxKeys))
		}
	}
	switch {
	case c.Replicas != 0 && c.Replicas != 1 && c.Replicas != 3 && c.Replicas != 5:
		return fmt.Errorf("bench: replicas %d: must be 1, 3 or 5", c.Replicas)
	case c.Replicas > 1 && c.NATSURL == "":
		return fmt.Errorf("bench: replicas %d needs nats-url (a JetStream cluster); the embedded server takes 1", c.Replicas)
	}
	return nil
}

// scenario runs one scenario and returns its rows. An error fails the rows
// it did not produce.
type scenario func(ctx context.Context, e *env) ([]Result, error)

var scenarioFuncs = map[string]scenario{
	Ingest:    runIngest,
	Admission: runAdmission,
	Drain:     runDrain,
	Pacing:    runPacing,
	Latency:   runLatency,
	RSS:       runRSS,
	Peers:     runPeers,
	Lanes:     runLanes,
	Keyed:     runKeyed,
	Records:   runRecords,
}

// Run runs the selected scenarios one after the other and returns their
// rows. A scenario that fails gives an error row and the run goes on; the
// error returned is for a run that could not start at all (bad config, no
// temporary directory) or was cancelled.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e, err := newEnv(cfg)
	if err != nil {
		return nil, err
	}
	defer e.close()
	ids := Scenarios
	if len(cfg.Only) > 0 {
		ids = slices.DeleteFunc(slices.Clone(Scenarios), func(id string) bool { return !slices.Contains(cfg.Only, id) })
	}
	var out []Result
	for i, id := range ids {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		e.prog.scenario(i+1, len(ids), id)
		rows, err := scenarioFuncs[id](ctx, e)
		out = append(out, rows...)
		if err != nil {
			out = append(out, Result{ID: id, Scenario: id, Verdict: Failed, Note: err.Error() + e.logTail()})
		}
		e.prog.done()
	}
	return out, ctx.Err()
}

// Machine describes the machine the figures come from.
func Machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs (GOMAXPROCS %d), %s %s/%s", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0),
		runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// PrintTable writes rows as an aligned Markdown table, followed by the notes
// of rows that have one.
func PrintTable(w io.Writer, rows []Result) {
	head := []string{"scenario", "ours", "reference", "ratio", "goal", "met?"}
	cells := [][]string{head}
	for _, r := range rows {
		cells = append(cells, []string{r.Scenario, r.Ours, r.Reference, r.Ratio, r.Goal, string(r.Verdict)})
	}
	width := make([]int, len(head))
	for _, row := range cells {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(row []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range row {
			b.WriteString(" " + c + strings.Repeat(" ", width[i]-len([]rune(c))) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	line(cells[0])
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, row := range cells[1:] {
		line(row)
	}
	var notes []string
	for _, r := range rows {
		if r.Note != "" {
			notes = append(notes, fmt.Sprintf("- %s: %s", r.Scenario, r.Note))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
}
