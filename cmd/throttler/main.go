// Command throttler is a queue-based leaky-bucket throttler for outbound
// work: jobs come in over HTTP or NATS, wait durably on JetStream, and leave
// at a constant, globally shared rate.
//
//	throttler serve --config configs/throttler.yaml   # the service (SIGHUP: reload keys, caller quotas and certificate)
//	throttler sink --listen 127.0.0.1:9000            # a target that logs arrivals
//	throttler lanes|lane|dead|keys …  --server URL --key K   # the CLI (docs/CLI.md)
//	throttler version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/sink"
)

// Set at build time by the Makefile and the Dockerfile:
// -ldflags "-X main.version=… -X main.revision=… -X main.modified=true".
// The revision is needed when the go tool records none (-buildvcs=false, a
// source tree without .git).
var (
	version  = ""
	revision = ""
	modified = ""
)

func main() {
	ctx, stop := signalContext()
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if err != errUsage { // a bare errUsage: the usage is printed already
			fmt.Fprintln(os.Stderr, "throttler:", err)
		}
		os.Exit(exitCode(err))
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
		fmt.Fprintln(os.Stderr, "throttler: second signal, exiting now")
		os.Exit(2)
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}

var errUsage = errors.New("usage")

const usage = `usage:
  throttler serve --config FILE     run the service
  throttler sink [--listen ADDR]    run a target that logs what arrives (default 127.0.0.1:9000)
  throttler lanes [--watch]         the lanes of a running server, as a table
  throttler lane set LANE --rate 50/s --burst 10
  throttler lane pause|resume LANE  hold a lane on every instance (jobs queue), or release it
  throttler dead ls|show|replay|purge LANE [SEQ]
  throttler keys LANE [KEY]         the keys of a keyed lane
  throttler job LANE ID [--wait]    a job's record (lanes with results); job cancel LANE ID cancels it
  throttler health [--url URL]      exit 0 when the server at URL (default
                                    http://127.0.0.1:8080/readyz) is ready: a container health check
  throttler version                 print the version

The commands that talk to a server take --server URL (env THROTTLER_SERVER,
default http://127.0.0.1:8080), --key SECRET (env THROTTLER_KEY), --json and
--timeout. Exit codes: 0 ok, 1 error, 2 usage or invalid request, 3 not
found, 4 no key or not allowed, 5 still throttled after retries
(docs/CLI.md).
`

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], getenv, stderr)
	case "sink":
		return runSink(ctx, args[1:], stdout, stderr)
	case "lanes":
		return cmdLanes(ctx, args[1:], getenv, stdout, stderr)
	case "lane":
		return cmdLane(ctx, args[1:], getenv, stdout, stderr)
	case "dead":
		return cmdDead(ctx, args[1:], getenv, stdout, stderr)
	case "keys":
		return cmdKeys(ctx, args[1:], getenv, stdout, stderr)
	case "job":
		return cmdJob(ctx, args[1:], getenv, stdout, stderr)
	case "health":
		return cmdHealth(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "throttler", describe(readBuild()))
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "throttler: unknown command %q\n%s", args[0], usage)
	return errUsage
}

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "configs/throttler.yaml", "config file")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	cfg, err := config.Load(*path, getenv)
	if err != nil {
		return err
	}
	logger := newLogger(stderr, cfg.Log.Level)
	// go-redis logs through a process-wide logger; route it into ours.
	redis.SetLogger(redisLogger{logger.With("component", "redis")})
	b := readBuild()
	logger.Info("starting", "version", b.Version, "revision", b.Revision, "go", b.GoVersion, "config", *path)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewBuildInfo(b))
	svc := service.New(cfg, logger, reg)
	svc.ReloadConfigWith(func() (config.Config, error) { return config.Load(*path, getenv) })
	tr, stopTracing, err := openTracing(getenv, b, logger, reg)
	if err != nil {
		return err
	}
	if tr != nil {
		svc.TraceWith(tr)
	}
	stopReload := reloadOnHUP(logger, svc)
	err = svc.Run(ctx)
	stopReload()
	stopTracing() // after the last delivery: its span is flushed
	var ce *config.Error
	if errors.As(err, &ce) && ce.File == "" {
		ce.File = *path // a setting the running system refused: name its file
	}
	return err
}

// reloadOnHUP makes SIGHUP reload the service's API keys, caller quotas
// and TLS certificate (service.Reload logs what it did); stop ends it.
func reloadOnHUP(logger *slog.Logger, svc *service.Service) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hup:
				logger.Info("SIGHUP: reloading the API keys, the caller quotas and the TLS certificate")
				_ = svc.Reload() // logged by the service
			case <-done:
				return
			}
		}
	})
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

func runSink(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9000", "address to listen on")
	status := fs.Int("status", 200, "HTTP status to answer")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	return sink.Run(ctx, sink.Config{Listen: *listen, Status: *status, Logger: newLogger(stdout, "info")})
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

// redisLogger adapts slog to go-redis's logger.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...))
}

// readBuild names this binary: the linker's version and revision when the
// build set them, else what the go tool recorded.
func readBuild() metrics.Build {
	bi, _ := debug.ReadBuildInfo()
	return resolveBuild(version, revision, modified, bi)
}

// resolveBuild picks the version (the linker's, else the module's, else
// "devel") and the revision (the linker's, else the go tool's vcs.revision,
// else "unknown"; with "-modified" for a tree with uncommitted changes).
func resolveBuild(version, revision, modified string, bi *debug.BuildInfo) metrics.Build {
	b := metrics.Build{Version: version, Revision: revision, GoVersion: runtime.Version()}
	dirty := modified == "true"
	if bi != nil {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		if b.Revision == "" {
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Revision = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	switch {
	case b.Revision == "":
		b.Revision = "unknown"
	case dirty:
		b.Revision += "-modified"
	}
	return b
}

// describe is the version line: "v1.2.3 (revision 3f2a9c1d04e5, go1.26.8)".
func describe(b metrics.Build) string {
	return fmt.Sprintf("%s (revision %s, %s)", b.Version, b.Revision, b.GoVersion)
}
