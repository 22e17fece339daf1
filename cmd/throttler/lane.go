package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/client"
)

const laneUsage = `usage: throttler lane set LANE [--rate 50/s] [--burst 10] [global flags]
       throttler lane pause LANE [global flags]
       throttler lane resume LANE [global flags]

set changes a lane's rate and/or burst on every instance (PATCH
/v1/lanes/{lane}; needs an admin key). The change is stored in JetStream
and outlives restarts; a changed config file does not undo it (set it
again). --rate is written as in the config file: 50/s, 1200/min, 1000/h,
or a number of jobs per second.

pause holds the lane on every instance: its jobs are still accepted and
queued, none starts until resume. Stored, like set: it outlives restarts.
`

func cmdLane(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "pause" || args[0] == "resume") {
		return cmdLanePause(ctx, args, getenv, stdout, stderr)
	}
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

// cmdLanePause runs lane pause|resume LANE.
func cmdLanePause(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := &cliEnv{stdout: stdout, stderr: stderr}
	fs := e.flags("lane "+args[0], getenv)
	fs.Usage = func() { fmt.Fprint(stderr, laneUsage); fs.PrintDefaults() }
	pos, err := e.parse(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("lane %s takes one LANE, got %d arguments", args[0], len(pos))
	}
	call := e.c.PauseLane
	if args[0] == "resume" {
		call = e.c.ResumeLane
	}
	st, err := call(ctx, pos[0])
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(st)
	}
	printLanes(stdout, []api.LaneStatus{*st})
	return nil
}
