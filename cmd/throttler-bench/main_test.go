package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"--frobnicate"}, {"extra"}, {"--keys", "ten"}} {
		var out bytes.Buffer
		if err := run(context.Background(), args, &out, &out); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want errUsage", args, err)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, &out); err != nil || !strings.Contains(out.String(), "-smoke") {
		t.Fatalf("--help: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"--only", "everything"}, &out, &out); err == nil || !strings.Contains(err.Error(), "unknown scenario") {
		t.Fatalf("--only everything: %v", err)
	}
	if err := run(context.Background(), []string{"--only", "keyed", "--keys", "1000,0"}, &out, &out); err == nil || !strings.Contains(err.Error(), "keys: 0") {
		t.Fatalf("--keys 1000,0: %v", err)
	}
	if err := run(context.Background(), []string{"--redis-url", "redis://10.0.0.5:6379"}, &out, &out); err == nil {
		t.Fatal("a Redis off loopback was accepted")
	}
}

// TestSmokeStartsTheService runs the scenarios that start the service binary
// (rss, and keyed with 20 keys) in smoke mode on the binary the test
// packages share (testenv.ThrottlerBinary; TestBuildThrottler covers the
// tool's own build): every row is measured, none skipped or failed; the
// keyed rows on both pacers. The two scenarios run side by side, each in a
// run of the tool of its own: smoke figures mean nothing, so nothing here
// is timed.
func TestSmokeStartsTheService(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service")
	}
	bin := testenv.ThrottlerBinary(t)
	for _, c := range []struct {
		only string
		args []string
		rows []string
	}{
		{"rss", []string{"--backlog", "500"}, []string{
			"RSS of throttler with the example config's lane (configs/throttler.yaml: 20/s, burst 10, max_backlog 100,000), 500 jobs offered",
			"RSS of throttler holding 500 jobs",
		}},
		{"keyed", []string{"--keys", "20"}, []string{
			"plain lane (no per_key) with backlog → sink, same process and sink, memory pacer",
			"plain lane (no per_key) with backlog → sink, same process and sink, Redis pacer",
			"keyed lane, 1 keys with backlog → sink, memory pacer",
			"keyed lane, 20 keys with backlog → sink, memory pacer",
			"keyed lane, 20 keys with backlog → sink, Redis pacer",
			"keyed lane, Redis memory per active key · per idle key, 20 keys",
			"cold key's first job behind a hot key's 2,000 backlog (202 → sink), memory pacer",
			"cold key's first job behind a hot key's 2,000 backlog (202 → sink), Redis pacer",
		}},
	} {
		t.Run(c.only, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"--smoke", "--only", c.only, "--throttler", bin}, c.args...)
			if err := run(ctx, args, &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			table := stdout.String()
			if !strings.HasPrefix(table, "throttler-bench ") {
				t.Fatalf("stdout:\n%s", table)
			}
			for _, want := range c.rows {
				if !strings.Contains(table, want) {
					t.Errorf("no row %q", want)
				}
			}
			if strings.Contains(table, "skipped") || strings.Contains(table, "| error") {
				t.Errorf("rows skipped or failed")
			}
			if t.Failed() {
				t.Fatalf("stdout:\n%s\nstderr:\n%s", table, stderr.String())
			}
		})
	}
}

// TestBuildThrottler: without --throttler the tool builds the service with
// the go command found on PATH, stamping its version, into the directory
// it is given; a failed build is an error that quotes the go command's
// output. The go command here is a script that records its arguments
// (the real link is what TestSmokeStartsTheService's binary went through).
func TestBuildThrottler(t *testing.T) {
	tools := t.TempDir()
	argsFile := filepath.Join(t.TempDir(), "args")
	shim := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + argsFile + "\n" +
		"while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then echo built > \"$2\"; fi; shift; done\n" +
		"[ -z \"$GO_SHIM_FAIL\" ] || { echo 'cmd/throttler: undefined: x' >&2; exit 1; }\n"
	if err := os.WriteFile(filepath.Join(tools, "go"), []byte(shim), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", tools+string(os.PathListSeparator)+os.Getenv("PATH"))

	dir := t.TempDir()
	bin, err := buildThrottler(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "throttler"); bin != want {
		t.Errorf("built %s, want %s", bin, want)
	}
	if b, err := os.ReadFile(bin); err != nil || string(b) != "built\n" {
		t.Errorf("the go command did not write the binary it returned: %q %v", b, err)
	}
	args, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{"build", "-ldflags", "-X main.version=" + buildVersion(), "-o", bin, throttlerPkg}, "\n") + "\n"
	if string(args) != want {
		t.Errorf("go called with\n%s\nwant\n%s", args, want)
	}

	t.Setenv("GO_SHIM_FAIL", "1")
	if _, err := buildThrottler(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "undefined: x") || !strings.Contains(err.Error(), "--throttler") {
		t.Errorf("a failed build: %v, want the go command's output and the hint", err)
	}
}
