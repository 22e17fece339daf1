package main

// The CLI: lanes, lane set, dead, keys. Each command talks to a running
// server through the public client package, prints a table (or JSON with
// --json) on stdout, and errors on stderr; exitCode maps an error to the
// exit codes documented in docs/CLI.md.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
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

const lanesUsage = `usage: throttler lanes [--watch] [--interval 2s] [global flags]

Lists every lane: limits and live state (GET /v1/lanes).
`

func cmdLanes(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := &cliEnv{stdout: stdout, stderr: stderr}
	fs := e.flags("lanes", getenv)
	watch := fs.Bool("watch", false, "refresh until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval with --watch")
	fs.Usage = func() { fmt.Fprint(stderr, lanesUsage); fs.PrintDefaults() }
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError("lanes takes no arguments, got %q", pos)
	}
	if *interval <= 0 {
		return usageError("--interval must be positive")
	}
	clear := *watch && !e.json && isTerminal(stdout)
	for {
		lanes, err := e.c.Lanes(ctx)
		if err != nil {
			if *watch && ctx.Err() != nil {
				return nil // interrupted
			}
			return err
		}
		switch {
		case e.json && *watch:
			// One line per refresh, for a pipe.
			if err := json.NewEncoder(stdout).Encode(api.Lanes{Lanes: lanes}); err != nil {
				return err
			}
		case e.json:
			if err := e.printJSON(api.Lanes{Lanes: lanes}); err != nil {
				return err
			}
		default:
			if clear {
				fmt.Fprint(stdout, "\033[H\033[2J")
			}
			if *watch {
				fmt.Fprintf(stdout, "%s  every %v  %s\n\n", e.server, *interval, time.Now().Format(time.TimeOnly))
			}
			printLanes(stdout, lanes)
		}
		if !*watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

func printLanes(w io.Writer, lanes []api.LaneStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tRATE/S\tBURST\tIN FLIGHT\tBACKLOG\tWAITING\tRETRYING\tDEAD\tDELIVERED\tUTIL\tSTATE\tTARGET")
	for _, l := range lanes {
		rate := fmtFloat(l.Rate)
		if l.EffectiveRate != l.Rate && l.EffectiveRate > 0 {
			rate = fmt.Sprintf("%s (now %s)", rate, fmtFloat(l.EffectiveRate))
		}
		state := "running"
		switch {
		case l.Error != "":
			state = "error: " + l.Error
		case l.Paused && l.PauseReason != "":
			state = "paused: " + l.PauseReason
		case l.Paused:
			state = "paused"
		case l.Adaptive:
			state = "running (adaptive)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%d\t%d\t%d\t%d\t%d\t%.0f%%\t%s\t%s\n", l.Name, rate, l.Burst, l.InFlight, l.MaxInflight,
			l.Backlog, l.Waiting, l.Retrying, l.Dead, l.Delivered, 100*l.Utilization, state, l.Target)
	}
	tw.Flush()
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

const laneUsage = `usage: throttler lane set LANE [--rate 50/s] [--burst 10] [global flags]

Changes a lane's rate and/or burst on every instance until they restart
(PATCH /v1/lanes/{lane}; needs an admin key). --rate is written as in the
config file: 50/s, 1200/min, 1000/h, or a number of jobs per second.
`

func cmdLane(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "set" {
		fmt.Fprint(stderr, laneUsage)
		return errUsage
	}
	e := &cliEnv{stdout: stdout, stderr: stderr}
	fs := e.flags("lane set", getenv)
	rate := fs.String("rate", "", "new rate: 50/s, 1200/min, 1000/h, or jobs per second")
	burst := fs.Int("burst", 0, "new burst (at least 1)")
	fs.Usage = func() { fmt.Fprint(stderr, laneUsage); fs.PrintDefaults() }
	pos, err := e.parse(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("lane set takes one LANE, got %d arguments", len(pos))
	}
	var change client.LaneChange
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["rate"] {
		change.Rate = client.Rate(*rate)
	}
	if set["burst"] {
		change.Burst = burst
	}
	if !set["rate"] && !set["burst"] {
		return usageError("lane set: give --rate and/or --burst")
	}
	st, err := e.c.SetLane(ctx, pos[0], change)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(st)
	}
	printLanes(stdout, []api.LaneStatus{*st})
	return nil
}

const deadUsage = `usage:
  throttler dead ls LANE [--limit 100] [--after SEQ]   list dead letters (--limit 0: all)
  throttler dead show LANE SEQ                         one dead letter with its payload
  throttler dead replay LANE [SEQ]                     replay one, or all (with progress on stderr)
  throttler dead purge LANE [SEQ]                      delete one, or all
  (global flags: --server, --key, --json, --timeout)
`

func cmdDead(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, deadUsage)
		return errUsage
	}
	sub := args[0]
	e := &cliEnv{stdout: stdout, stderr: stderr}
	fs := e.flags("dead "+sub, getenv)
	fs.Usage = func() { fmt.Fprint(stderr, deadUsage); fs.PrintDefaults() }
	var limit *int
	var after *uint64
	var chunk *int
	switch sub {
	case "ls":
		limit = fs.Int("limit", 100, "at most this many (0: all)")
		after = fs.Uint64("after", 0, "list those after this sequence")
	case "replay":
		chunk = fs.Int("chunk", 500, "replay-all: dead letters per request (progress is shown after each)")
	case "show", "purge":
	default:
		fmt.Fprintf(stderr, "throttler dead: unknown subcommand %q\n%s", sub, deadUsage)
		return errUsage
	}
	pos, err := e.parse(fs, args[1:])
	if err != nil {
		return err
	}
	maxArgs := map[string]int{"ls": 1, "show": 2, "replay": 2, "purge": 2}[sub]
	minArgs := map[string]int{"ls": 1, "show": 2, "replay": 1, "purge": 1}[sub]
	if len(pos) < minArgs || len(pos) > maxArgs {
		fmt.Fprint(stderr, deadUsage)
		return usageError("dead %s: wrong number of arguments (%d)", sub, len(pos))
	}
	lane := pos[0]
	var seq uint64
	if len(pos) == 2 {
		seq, err = strconv.ParseUint(pos[1], 10, 64)
		if err != nil || seq == 0 {
			return usageError("dead %s: SEQ %q is not a dead-letter sequence number", sub, pos[1])
		}
	}
	switch sub {
	case "ls":
		if *limit < 0 {
			return usageError("--limit must be 0 or more")
		}
		return e.deadList(ctx, lane, *after, *limit)
	case "show":
		d, err := e.c.DeadLetter(ctx, lane, seq)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(d)
		}
		printDead(stdout, d)
		return nil
	case "replay":
		if seq != 0 {
			id, err := e.c.ReplayDead(ctx, lane, seq)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(map[string]any{"replayed": 1, "id": id})
			}
			fmt.Fprintf(stdout, "replayed dead letter %d (job %s) into lane %s\n", seq, id, lane)
			return nil
		}
		if *chunk < 1 || *chunk > 100000 {
			return usageError("--chunk must be 1 to 100000")
		}
		return e.replayAll(ctx, lane, *chunk)
	default: // purge
		if seq != 0 {
			if err := e.c.DeleteDead(ctx, lane, seq); err != nil {
				return err
			}
			if e.json {
				return e.printJSON(map[string]any{"deleted": 1})
			}
			fmt.Fprintf(stdout, "deleted dead letter %d of lane %s\n", seq, lane)
			return nil
		}
		if err := e.c.PurgeDead(ctx, lane); err != nil {
			return err
		}
		if e.json {
			return e.printJSON(map[string]any{"purged": true})
		}
		fmt.Fprintf(stdout, "purged the dead letters of lane %s\n", lane)
		return nil
	}
}

// deadList pages through a lane's dead letters, up to limit (0: all).
func (e *cliEnv) deadList(ctx context.Context, lane string, after uint64, limit int) error {
	var all []api.DeadLetter
	for {
		page := 1000
		if limit > 0 {
			page = min(page, limit-len(all))
		}
		p, err := e.c.DeadLetters(ctx, lane, after, page)
		if err != nil {
			return err
		}
		all = append(all, p.Dead...)
		if p.NextAfter == 0 || (limit > 0 && len(all) >= limit) {
			break
		}
		after = p.NextAfter
	}
	if e.json {
		if all == nil {
			all = []api.DeadLetter{}
		}
		return e.printJSON(api.DeadLetters{Dead: all})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tKEY\tATTEMPTS\tLAST STATUS\tDEAD AT\tSIZE\tREASON")
	for _, d := range all {
		status := "-"
		if d.LastStatus != 0 {
			status = strconv.Itoa(d.LastStatus)
		}
		key := d.Key
		if key == "" {
			key = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n", d.Seq, d.ID, key, d.Attempts, status,
			d.DeadAt.UTC().Format(time.RFC3339), d.Size, d.Reason)
	}
	return tw.Flush()
}

func printDead(w io.Writer, d *api.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("seq", strconv.FormatUint(d.Seq, 10))
	row("id", d.ID)
	row("lane", d.Lane)
	row("key", d.Key)
	row("reason", d.Reason)
	row("attempts", strconv.Itoa(d.Attempts))
	if d.LastStatus != 0 {
		row("last status", strconv.Itoa(d.LastStatus))
	}
	row("last error", d.LastError)
	row("dead at", d.DeadAt.UTC().Format(time.RFC3339Nano))
	row("content type", d.ContentType)
	row("size", strconv.Itoa(d.Size))
	tw.Flush()
	if utf8.Valid(d.Payload) && !strings.ContainsFunc(string(d.Payload), func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' && r != '\r' }) {
		fmt.Fprintf(w, "payload:\n%s\n", d.Payload)
	} else {
		fmt.Fprintf(w, "payload (base64):\n%s\n", base64Std(d.Payload))
	}
}

// replayAll replays a lane's dead letters chunk by chunk, printing
// progress on stderr after each. It replays as many as the lane held when
// it began (those are the oldest, replayed first): a replayed job that dies
// again lands behind them and is not replayed a second time.
func (e *cliEnv) replayAll(ctx context.Context, lane string, chunk int) error {
	total := -1 // unknown
	if lanes, err := e.c.Lanes(ctx); err == nil {
		for _, l := range lanes {
			if l.Name == lane {
				total = int(min(l.Dead, 1<<40))
			}
		}
	}
	done := 0
	start := time.Now()
	tty := isTerminal(e.stderr)
	for total < 0 || done < total || done == 0 {
		want := chunk
		if total > 0 {
			want = min(chunk, total-done)
		}
		n, err := e.c.ReplayAllDead(ctx, lane, want)
		done += n
		if err != nil {
			if done > 0 {
				fmt.Fprintf(e.stderr, "\nreplayed %d before the error\n", done)
			}
			return err
		}
		line := fmt.Sprintf("replayed %d", done)
		if total > 0 {
			line += fmt.Sprintf(" of %d (%d%%)", total, min(100, done*100/total))
		}
		line += fmt.Sprintf(", %.1fs", time.Since(start).Seconds())
		if tty {
			fmt.Fprintf(e.stderr, "\r%s", line)
		} else {
			fmt.Fprintln(e.stderr, line)
		}
		if n < want {
			break // no more
		}
	}
	if tty {
		fmt.Fprintln(e.stderr)
	}
	if e.json {
		return e.printJSON(map[string]any{"replayed": done})
	}
	fmt.Fprintf(e.stdout, "replayed %d dead letters into lane %s\n", done, lane)
	return nil
}

const keysUsage = `usage:
  throttler keys LANE                       a keyed lane: per-key limits, active and paused keys
  throttler keys LANE KEY                   one key: limits, overrides, state
  throttler keys set LANE KEY [--rate 5/s] [--burst 2] [--max-inflight 4] [--weight 2] [--pause|--resume] [--reset]
  (global flags: --server, --key, --json, --timeout)
`

func cmdKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, keysUsage)
		return errUsage
	}
	e := &cliEnv{stdout: stdout, stderr: stderr}
	if args[0] == "set" {
		fs := e.flags("keys set", getenv)
		fs.Usage = func() { fmt.Fprint(stderr, keysUsage); fs.PrintDefaults() }
		rate := fs.String("rate", "", "the key's rate: 5/s, 300/min, or jobs per second")
		burst := fs.Int("burst", 0, "the key's burst")
		inflight := fs.Int("max-inflight", 0, "the key's max_inflight")
		weight := fs.Float64("weight", 0, "the key's weight when the lane-wide cap binds")
		pause := fs.Bool("pause", false, "pause the key")
		resume := fs.Bool("resume", false, "resume the key")
		reset := fs.Bool("reset", false, "drop the key's override (back to the lane's per_key values)")
		pos, err := e.parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 2 {
			return usageError("keys set takes LANE KEY, got %d arguments", len(pos))
		}
		var ch client.KeyChange
		n := 0
		fs.Visit(func(f *flag.Flag) {
			n++
			switch f.Name {
			case "rate":
				ch.Rate = client.Rate(*rate)
			case "burst":
				ch.Burst = burst
			case "max-inflight":
				ch.MaxInflight = inflight
			case "weight":
				ch.Weight = weight
			case "pause", "resume":
			case "reset":
				ch.Reset = *reset
			default:
				n-- // a global flag
			}
		})
		if *pause && *resume {
			return usageError("keys set: --pause and --resume together")
		}
		if *pause || *resume {
			p := *pause
			ch.Paused = &p
		}
		if n == 0 {
			return usageError("keys set: nothing to change")
		}
		k, err := e.c.SetKey(ctx, pos[0], pos[1], ch)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(k)
		}
		printKeys(stdout, []api.KeyStatus{*k})
		return nil
	}
	fs := e.flags("keys", getenv)
	fs.Usage = func() { fmt.Fprint(stderr, keysUsage); fs.PrintDefaults() }
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	switch len(pos) {
	case 1:
		lanes, err := e.c.Lanes(ctx)
		if err != nil {
			return err
		}
		for _, l := range lanes {
			if l.Name != pos[0] {
				continue
			}
			if l.Keyed == nil {
				return fmt.Errorf("%w: lane %s is not keyed", client.ErrNotFound, l.Name)
			}
			if e.json {
				return e.printJSON(map[string]any{"lane": l.Name, "keyed": l.Keyed})
			}
			k := l.Keyed
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LANE\tPER-KEY RATE/S\tBURST\tMAX IN FLIGHT\tORDERED\tKEYS ACTIVE\tKEYS PAUSED\tLANE RATE/S")
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%v\t%d\t%d\t%s\n", l.Name, fmtFloat(k.PerKeyRate), k.PerKeyBurst, k.PerKeyMaxInflight,
				k.Ordered, k.KeysActive, k.KeysPaused, fmtFloat(l.Rate))
			if err := tw.Flush(); err != nil || len(k.Keys) == 0 {
				return err
			}
			// The busiest keys, cluster-wide, most jobs first.
			fmt.Fprintln(stdout)
			tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tBACKLOG")
			for _, b := range k.Keys {
				fmt.Fprintf(tw, "%s\t%d\n", b.Key, b.Backlog)
			}
			return tw.Flush()
		}
		return fmt.Errorf("%w: no lane named %q", client.ErrNotFound, pos[0])
	case 2:
		k, err := e.c.Key(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(k)
		}
		printKeys(stdout, []api.KeyStatus{*k})
		return nil
	}
	fmt.Fprint(stderr, keysUsage)
	return usageError("keys takes LANE [KEY], got %d arguments", len(pos))
}

func printKeys(w io.Writer, keys []api.KeyStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tKEY\tRATE/S\tBURST\tIN FLIGHT\tWEIGHT\tOVERRIDE\tSTATE")
	for _, k := range keys {
		state := "idle"
		switch {
		case k.Paused:
			state = "paused"
		case k.PausedUntil != "":
			state = "waiting until " + k.PausedUntil
		case k.Active:
			state = "active"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%s\t%v\t%s\n", k.Lane, k.Key, fmtFloat(k.Rate), k.Burst, k.InFlight, k.MaxInflight,
			fmtFloat(k.Weight), k.Overridden, state)
	}
	tw.Flush()
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
