package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

const healthUsage = `usage: throttler health [--url http://127.0.0.1:8080/readyz] [--timeout 2s]

Asks a running server whether it is ready (GET /readyz, which needs no key)
and exits 0 when it answers 200, else 1. For container health checks: the
image has no shell, curl or wget, so the binary checks itself.
`

// cmdHealth runs throttler health.
func cmdHealth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8080/readyz", "the readiness URL to ask")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	fs.Usage = func() { fmt.Fprint(stderr, healthUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return errUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return usageError("health --url: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s answered %d: %s", *url, resp.StatusCode, body)
	}
	fmt.Fprintf(stdout, "ok: %s\n", *url)
	return nil
}
