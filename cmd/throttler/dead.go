package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
)

const deadUsage = `usage:
  throttler dead ls LANE [--limit 100] [--after SEQ]   list dead letters (--limit 0: all)
  throttler dead show LANE SEQ                         one dead letter with its payload
  throttler dead replay LANE [SEQ] [--throttle-key K]  replay one (under key K), or all (with progress on stderr)
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
	var key *string
	switch sub {
	case "ls":
		limit = fs.Int("limit", 100, "at most this many (0: all)")
		after = fs.Uint64("after", 0, "list those after this sequence")
	case "replay":
		chunk = fs.Int("chunk", 500, "replay-all: dead letters per request (progress is shown after each)")
		key = fs.String("throttle-key", "", "replay one: the job's key (a job dead-lettered without a key on a keyed lane, or with one the lane refuses)")
	case "show", "purge":
	case "-h", "--help", "help":
		fs.Usage()
		return errUsage
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
		d, err := e.c.GetDead(ctx, lane, seq)
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
			id, err := e.c.ReplayDeadWithKey(ctx, lane, seq, *key)
			if err != nil {
				return err
			}
			if e.json {
				out := map[string]any{"replayed": 1, "id": id}
				if *key != "" {
					out["key"] = *key
				}
				return e.printJSON(out)
			}
			if *key != "" {
				fmt.Fprintf(stdout, "replayed dead letter %d (job %s) into lane %s, key %s\n", seq, id, lane, *key)
			} else {
				fmt.Fprintf(stdout, "replayed dead letter %d (job %s) into lane %s\n", seq, id, lane)
			}
			return nil
		}
		if *key != "" {
			return usageError("dead replay: --throttle-key needs a SEQ: it is one job's key")
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
		p, err := e.c.ListDead(ctx, lane, after, page)
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
			d.DeadAt.UTC().Format(time.RFC3339), d.Size, cell(d.Reason))
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
	row("reason", shown(d.Reason))
	row("attempts", strconv.Itoa(d.Attempts))
	if d.LastStatus != 0 {
		row("last status", strconv.Itoa(d.LastStatus))
	}
	row("last error", shown(d.LastError)) // the target's status text is in it
	row("dead at", d.DeadAt.UTC().Format(time.RFC3339Nano))
	row("content type", d.ContentType)
	row("size", strconv.Itoa(d.Size))
	// The job's request shape (API.md, "Dead letters"): names only, never
	// a forwarded header's value.
	row("method", shown(d.Method))
	row("path", shown(d.Path))
	row("url", shown(d.URL))
	row("headers", shown(strings.Join(d.Headers, ", ")))
	if d.Expires != nil {
		row("expires", d.Expires.UTC().Format(time.RFC3339Nano))
	}
	tw.Flush()
	// Text with no control character a terminal acts on (CRLF lines
	// allowed) is printed as it is; anything else as base64.
	if utf8.Valid(d.Payload) && !strings.ContainsFunc(string(d.Payload), func(r rune) bool { return r != '\r' && unsafeRune(r) }) {
		fmt.Fprintf(w, "payload:\n%s\n", d.Payload)
	} else {
		fmt.Fprintf(w, "payload (base64):\n%s\n", base64Std(d.Payload))
	}
}

// replayAll replays a lane's dead letters chunk by chunk, printing
// progress on stderr after each. It replays as many as the lane held when
// it began (those are the oldest, replayed first): a replayed job that dies
// again lands behind them and is not replayed a second time. Dead letters
// past their expiry, and those that could never be delivered as they are
// (no key on a keyed lane, or a key the lane refuses), are passed over and
// stay; they count towards what the lane held, so that the chunks stop at
// the jobs that died again.
func (e *cliEnv) replayAll(ctx context.Context, lane string, chunk int) error {
	total := -1 // unknown
	if lanes, err := e.c.Lanes(ctx); err == nil {
		for _, l := range lanes {
			if l.Name == lane {
				total = int(min(l.Dead, 1<<40))
			}
		}
	}
	// expired and undeliverable are the counts of the latest call: each
	// call passes over those dead letters ahead of what it replays, the
	// ones earlier calls passed included, so the latest has seen every
	// one so far.
	done, expired, undeliverable := 0, 0, 0
	var undeliverableSeqs []uint64
	// The first call's bound is every later call's: a job it replayed
	// that died again before the next call is not replayed twice.
	var until uint64
	start := time.Now()
	tty := isTerminal(e.stderr)
	for total < 0 || done+expired+undeliverable < total || done == 0 {
		want := chunk
		if total > 0 {
			want = max(1, min(chunk, total-done-expired-undeliverable))
		}
		r, err := e.c.ReplayAllUntil(ctx, lane, want, until)
		if until == 0 {
			until = r.Until
		}
		done += r.Replayed
		expired = max(expired, r.Expired)
		if r.Undeliverable >= undeliverable {
			undeliverable, undeliverableSeqs = r.Undeliverable, r.UndeliverableSeqs
		}
		if err != nil {
			if done > 0 {
				fmt.Fprintf(e.stderr, "\nreplayed %d before the error\n", done)
			}
			return err
		}
		line := fmt.Sprintf("replayed %d", done)
		if total > 0 {
			line += fmt.Sprintf(" of %d", total)
			if expired > 0 {
				line += fmt.Sprintf(", %d expired passed over", expired)
			}
			if undeliverable > 0 {
				line += fmt.Sprintf(", %d undeliverable passed over", undeliverable)
			}
			line += fmt.Sprintf(" (%d%%)", min(100, (done+expired+undeliverable)*100/total))
		}
		line += fmt.Sprintf(", %.1fs", time.Since(start).Seconds())
		if tty {
			fmt.Fprintf(e.stderr, "\r%s", line)
		} else {
			fmt.Fprintln(e.stderr, line)
		}
		if r.Replayed < want {
			break // no more
		}
	}
	if tty {
		fmt.Fprintln(e.stderr)
	}
	if e.json {
		out := map[string]any{"replayed": done, "expired": expired}
		if undeliverable > 0 {
			out["undeliverable"], out["undeliverable_seqs"] = undeliverable, undeliverableSeqs
		}
		return e.printJSON(out)
	}
	fmt.Fprintf(e.stdout, "replayed %d dead letters into lane %s\n", done, lane)
	if expired > 0 {
		fmt.Fprintf(e.stdout, "%d dead letters past their Throttle-Expires were not replayed; they stay dead\n", expired)
	}
	if undeliverable > 0 {
		seqs := make([]string, len(undeliverableSeqs))
		for i, s := range undeliverableSeqs {
			seqs[i] = strconv.FormatUint(s, 10)
		}
		more := ""
		if len(seqs) < undeliverable {
			more = ", …"
		}
		fmt.Fprintf(e.stdout, "%d dead letters could never be delivered as they are (no key on a keyed lane, or a key the lane refuses) and were not replayed; they stay dead: %s%s (dead replay %s SEQ --throttle-key K, or dead purge %s SEQ)\n",
			undeliverable, strings.Join(seqs, " "), more, lane, lane)
	}
	return nil
}
