package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/throttler/throttler/api"
)

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
