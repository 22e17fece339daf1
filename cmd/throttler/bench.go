package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/bench"
)

const benchUsage = `usage: throttler bench [flags]

Measures the throttler end to end against its goals and against peer
libraries in one run (see docs/BENCHMARKS.md) and prints one Markdown table.
Starts what it needs: embedded NATS (or --nats-url), a redis-server on a free
loopback port (or --redis-url; Redis rows are skipped without either), a
local sink. Only loopback addresses are contacted.

flags:
`

// runBench is `throttler bench`: it runs the load tool and prints the table
// on stdout, progress on stderr.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage)
		fs.PrintDefaults()
	}
	smoke := fs.Bool("smoke", false, "tiny counts: checks that every scenario runs and prints; figures mean nothing")
	only := fs.String("only", "", "comma-separated scenarios to run: "+strings.Join(bench.Scenarios, ", ")+" (default all)")
	redisURL := fs.String("redis-url", "", "Redis to use (loopback only); default: start redis-server on a free port")
	natsURL := fs.String("nats-url", "", "NATS with JetStream to use (loopback only); default: the service's embedded server")
	duration := fs.Duration("duration", 0, "cap of each timed loop (default 5s, 500ms with --smoke)")
	backlog := fs.Int("backlog", 0, "backlog of the rss scenario (default 1000000, 10000 with --smoke)")
	enforce := fs.Bool("enforce", false, "exit non-zero when a goal is missed")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (load tool and in-process service) to this file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "throttler bench: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	cfg := bench.Config{
		Smoke: *smoke, RedisURL: *redisURL, NATSURL: *natsURL,
		Duration: *duration, Backlog: *backlog, Progress: stderr,
	}
	if *only != "" {
		for id := range strings.SplitSeq(*only, ",") {
			cfg.Only = append(cfg.Only, strings.TrimSpace(id))
		}
	}
	if exe, err := os.Executable(); err == nil {
		cfg.Binary = exe
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	mode := "full"
	if *smoke {
		mode = "smoke (tiny counts: the figures mean nothing, goals are not enforced)"
	}
	start := time.Now()
	rows, err := bench.Run(ctx, cfg)
	fmt.Fprintf(stdout, "throttler bench %s, %s\nmachine: %s\nmode: %s; took %v\n\n", buildVersion(),
		start.UTC().Format(time.RFC3339), bench.Machine(), mode, time.Since(start).Round(time.Second))
	bench.PrintTable(stdout, rows)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	failed, missed := 0, 0
	for _, r := range rows {
		switch r.Verdict {
		case bench.Failed:
			failed++
		case bench.Missed:
			missed++
		}
	}
	switch {
	case failed > 0:
		return fmt.Errorf("bench: %d scenario(s) failed", failed)
	case missed > 0 && *enforce && !*smoke:
		return fmt.Errorf("bench: %d goal(s) missed", missed)
	}
	return nil
}
