// Command throttler-bench is the throttler's load tool: it measures the
// service end to end against its goals and against peer libraries in one
// run, on loopback only, and prints one Markdown table (docs/BENCHMARKS.md).
//
//	go run ./cmd/throttler-bench                 # every scenario, about 8 minutes (4.5 of them keyed)
//	go run ./cmd/throttler-bench --smoke         # tiny counts: proves every scenario runs
//	go run ./cmd/throttler-bench --only pacing,latency --duration 10s
//
// It is a binary of its own so that the service binary links none of the
// peer libraries it compares against.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/throttler/throttler/internal/bench"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	ctx, stop := signalContext()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "throttler-bench:", err)
		}
		os.Exit(1)
	}
}

// signalContext is cancelled by the first SIGINT or SIGTERM; a second one
// forces the process out at once.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "throttler-bench: second signal, exiting now")
		os.Exit(2)
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}

// errUsage is returned for a command line that does not parse; the flag
// package has already said why on stderr.
var errUsage = errors.New("usage")

const usage = `usage: throttler-bench [flags]

Measures the throttler end to end against its goals and against peer
libraries in one run (see docs/BENCHMARKS.md) and prints one Markdown table.
Starts what it needs: embedded NATS (or --nats-url), a redis-server on a free
loopback port (or --redis-url; Redis rows are skipped without either), a
local sink, and for the rss rows a throttler process (--throttler, or one
built with the go command from the module this runs in). Only loopback
addresses are contacted.

flags:
`

// run is the whole tool: it parses args, runs the load tool and prints the
// table on stdout, progress on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("throttler-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	smoke := fs.Bool("smoke", false, "tiny counts: checks that every scenario runs and prints; figures mean nothing")
	only := fs.String("only", "", "comma-separated scenarios to run: "+strings.Join(bench.Scenarios, ", ")+" (default all)")
	redisURL := fs.String("redis-url", "", "Redis to use (loopback only); default: start redis-server on a free port")
	natsURL := fs.String("nats-url", "", "NATS with JetStream to use (loopback only); default: the service's embedded server")
	replicas := fs.Int("replicas", 0, "nats.replicas of the services on --nats-url, a JetStream cluster (3 to compare R3 with R1); default 1")
	duration := fs.Duration("duration", 0, "cap of each timed loop (default 5s, 500ms with --smoke)")
	backlog := fs.Int("backlog", 0, "backlog of the rss scenario (default 1000000, 10000 with --smoke)")
	keys := fs.String("keys", "", "comma-separated key counts of the keyed scenario (default 1000,10000,100000; 100 with --smoke)")
	throttler := fs.String("throttler", "", "throttler binary the rss scenario starts; default: build ./cmd/throttler with the go command")
	enforce := fs.Bool("enforce", false, "exit non-zero when a goal is missed")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (load tool and in-process service) to this file")
	mutexProfile := fs.String("mutexprofile", "", "write a mutex contention profile of the whole run to this file (every contention event is sampled)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "throttler-bench: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	cfg := bench.Config{
		Smoke: *smoke, RedisURL: *redisURL, NATSURL: *natsURL, Replicas: *replicas,
		Duration: *duration, Backlog: *backlog, Binary: *throttler, Progress: stderr,
	}
	if *keys != "" {
		for v := range strings.SplitSeq(*keys, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				fmt.Fprintf(stderr, "throttler-bench: keys: %q is not a count\n", v)
				return errUsage
			}
			cfg.Keys = append(cfg.Keys, n)
		}
	}
	if *only != "" {
		for id := range strings.SplitSeq(*only, ",") {
			cfg.Only = append(cfg.Only, strings.TrimSpace(id))
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Binary == "" && (len(cfg.Only) == 0 || slices.Contains(cfg.Only, bench.RSS) || slices.Contains(cfg.Only, bench.Lanes) ||
		slices.Contains(cfg.Only, bench.Keyed)) {
		dir, err := os.MkdirTemp("", "throttler-bench-bin-")
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(dir)
		fmt.Fprintln(stderr, "building ./cmd/throttler for the rss rows")
		if cfg.Binary, err = buildThrottler(ctx, dir); err != nil {
			// The rss rows then say they were skipped, and why.
			fmt.Fprintf(stderr, "throttler-bench: %v\n", err)
		}
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
	if *mutexProfile != "" {
		runtime.SetMutexProfileFraction(1)
		defer writeProfile("mutex", *mutexProfile, stderr)
	}
	mode := "full"
	if *smoke {
		mode = "smoke (tiny counts: the figures mean nothing, goals are not enforced)"
	}
	start := time.Now()
	rows, err := bench.Run(ctx, cfg)
	fmt.Fprintf(stdout, "throttler-bench %s, %s\nmachine: %s\nmode: %s; took %v\n\n", buildVersion(),
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

// throttlerPkg is the service's main package, built for the rss rows.
const throttlerPkg = "github.com/throttler/throttler/cmd/throttler"

// buildThrottler builds the service binary into dir with the go command,
// which works when the tool runs inside the module (`go run
// ./cmd/throttler-bench`), and returns its path.
func buildThrottler(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "throttler")
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", "-X main.version="+buildVersion(), "-o", bin, throttlerPkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s (pass --throttler to use a built binary): %w: %s", throttlerPkg, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}

// writeProfile writes the named runtime profile (mutex) to path; a
// failure is reported on stderr, since the table was already printed.
func writeProfile(name, path string, stderr io.Writer) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(stderr, "throttler-bench: %s profile: %v\n", name, err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		fmt.Fprintf(stderr, "throttler-bench: %s profile: %v\n", name, err)
	}
}
