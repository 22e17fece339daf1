package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/throttler/throttler/api"
)

const jobUsage = `usage: throttler job LANE ID [--wait] [global flags]
       throttler job cancel LANE ID [global flags]

job shows a job's record on a lane with results (GET
/v1/lanes/{lane}/jobs/{id}): its state, times, attempts and, once settled,
the target's answer. --wait waits until the job settles (bounded by
--timeout when given). cancel cancels a job that has not started (DELETE):
it is never delivered; a job that started or settled cannot be cancelled
(exit 2, 409 job-started). An unknown id exits 3.
`

func cmdJob(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cancel := len(args) > 0 && args[0] == "cancel"
	if cancel {
		args = args[1:]
	}
	e := &cliEnv{stdout: stdout, stderr: stderr}
	name := "job"
	if cancel {
		name = "job cancel"
	}
	fs := e.flags(name, getenv)
	wait := false
	if !cancel {
		fs.BoolVar(&wait, "wait", false, "wait until the job settles")
	}
	fs.Usage = func() { fmt.Fprint(stderr, jobUsage); fs.PrintDefaults() }
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError("%s takes LANE and ID, got %d arguments", name, len(pos))
	}
	var rec *api.JobRecord
	switch {
	case cancel:
		rec, err = e.c.Cancel(ctx, pos[0], pos[1])
	case wait:
		rec, err = e.c.Wait(ctx, pos[0], pos[1])
	default:
		rec, err = e.c.Get(ctx, pos[0], pos[1])
	}
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(rec)
	}
	printRecord(stdout, rec)
	return nil
}

// printRecord writes a record for a person.
func printRecord(w io.Writer, r *api.JobRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.Format(time.RFC3339Nano)
	}
	fmt.Fprintf(tw, "id\t%s\nlane\t%s\nstate\t%s\n", r.ID, r.Lane, r.State)
	if r.Key != "" {
		fmt.Fprintf(tw, "key\t%s\n", r.Key)
	}
	fmt.Fprintf(tw, "stored\t%s\nstarted\t%s\nfinished\t%s\n", at(r.StoredAt), at(r.StartedAt), at(r.FinishedAt))
	if r.Reason != "" {
		fmt.Fprintf(tw, "reason\t%s\n", shown(r.Reason))
	}
	for i, a := range r.Attempts {
		what := fmt.Sprint(a.Status)
		if a.Status == 0 {
			what = shown(a.Error)
		}
		fmt.Fprintf(tw, "attempt %d\t%s  %s  %.1f ms\n", i+1, a.At.Format(time.RFC3339Nano), what, a.DurationMillis)
	}
	if p := r.Response; p != nil {
		fmt.Fprintf(tw, "response\t%d\n", p.Status)
		for k, v := range p.Headers {
			fmt.Fprintf(tw, "  %s\t%s\n", shown(k), shown(v))
		}
		body := p.Body
		if p.BodyBase64 != "" {
			body = "(base64) " + p.BodyBase64
		}
		if p.Truncated {
			body += " … (cut at results.max_body)"
		}
		// The target's own text: shown, as every string it chose.
		fmt.Fprintf(tw, "body\t%s\n", shown(body))
	}
	_ = tw.Flush()
}
