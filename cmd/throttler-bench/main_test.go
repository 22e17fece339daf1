package main

import (
	"bytes"
	"context"
	"errors"
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

// TestSmokeBuildsTheService runs the scenarios that start the service binary
// (rss, and keyed with 20 keys) in smoke mode: the tool builds the binary
// itself (once) and starts it, and every row is measured, none skipped or
// failed; the keyed rows on both pacers.
func TestSmokeBuildsTheService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"--smoke", "--only", "rss,keyed", "--backlog", "500", "--keys", "20"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	table := stdout.String()
	if !strings.HasPrefix(table, "throttler-bench ") || !strings.Contains(table, "RSS of throttler holding 500 jobs") {
		t.Fatalf("stdout:\n%s", table)
	}
	for _, want := range []string{
		"RSS of throttler with the example config's lane (configs/throttler.yaml: 20/s, burst 10, max_backlog 100,000), 500 jobs offered",
		"keyed lane, 1 keys with backlog → sink, memory pacer",
		"keyed lane, 20 keys with backlog → sink, memory pacer",
		"keyed lane, 20 keys with backlog → sink, Redis pacer",
		"keyed lane, Redis memory per active key · per idle key, 20 keys",
		"cold key's first job behind a hot key's 2,000 backlog (202 → sink), memory pacer",
		"cold key's first job behind a hot key's 2,000 backlog (202 → sink), Redis pacer",
	} {
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
}
