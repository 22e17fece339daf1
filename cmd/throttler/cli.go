package main

// The CLI: lanes, lane set, dead, keys. Each command talks to a running
// server through the public client package, prints a table (or JSON with
// --json) on stdout, and errors on stderr; exitCode maps an error to the
// exit codes documented in docs/CLI.md.

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/throttler/throttler/client"
)

// Exit codes (docs/CLI.md). A script can rely on them.
const (
	exitOK        = 0
	exitError     = 1 // anything else: network, server error, bad config
	exitUsage     = 2 // bad flags or arguments, or a request the server refused as invalid (400, 413)
	exitNotFound  = 3 // no such lane, dead letter, key (404)
	exitDenied    = 4 // no API key, an unknown one, or one without the scope (401, 403)
	exitThrottled = 5 // still 429 or 503 after the client's retries
)

// exitCode is the process exit code for what run returned.
func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage), errors.Is(err, client.ErrInvalid):
		return exitUsage
	case errors.Is(err, client.ErrNotFound):
		return exitNotFound
	case errors.Is(err, client.ErrUnauthorized), errors.Is(err, client.ErrForbidden):
		return exitDenied
	case errors.Is(err, client.ErrThrottled):
		return exitThrottled
	}
	return exitError
}

// usageError is a usage mistake, with what to print.
func usageError(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

// cliEnv is what every CLI command shares: the global flags and the
// output streams.
type cliEnv struct {
	server, key string
	json        bool
	timeout     time.Duration
	stdout      io.Writer
	stderr      io.Writer
	c           *client.Client
}

// flags returns a FlagSet with the global flags (--server, --key, --json,
// --timeout) registered, their defaults taken from the environment.
func (e *cliEnv) flags(name string, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	server := getenv("THROTTLER_SERVER")
	if server == "" {
		server = "http://127.0.0.1:8080"
	}
	fs.StringVar(&e.server, "server", server, "server URL (env THROTTLER_SERVER)")
	fs.StringVar(&e.key, "key", getenv("THROTTLER_KEY"), "API key secret (env THROTTLER_KEY)")
	fs.BoolVar(&e.json, "json", false, "print JSON instead of a table")
	fs.DurationVar(&e.timeout, "timeout", 30*time.Second, "timeout of one HTTP request")
	return fs
}

// parse parses args, flags and positional arguments in any order, and
// makes the client.
func (e *cliEnv) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, errUsage // the flag package printed why
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if strings.TrimSpace(e.server) == "" {
		return nil, usageError("--server is empty")
	}
	opts := []client.Option{client.WithUserAgent("throttler-cli/" + readBuild().Version)}
	if e.key != "" {
		opts = append(opts, client.WithAPIKey(e.key))
	}
	if e.timeout > 0 {
		opts = append(opts, client.WithHTTPClient(newHTTPClient(e.timeout)))
	}
	c, err := client.New(e.server, opts...)
	if err != nil {
		return nil, usageError("--server: %v", err)
	}
	e.c = c
	return pos, nil
}

func (e *cliEnv) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newHTTPClient(timeout time.Duration) *http.Client { return &http.Client{Timeout: timeout} }

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
