package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/client"
)

const keysUsage = `usage:
  throttler keys LANE                       a keyed lane: per-key limits, active and paused keys
  throttler keys LANE KEY                   one key: limits, overrides, state
  throttler keys set LANE KEY [--rate 5/s] [--burst 2] [--max-inflight 4] [--weight 2] [--pause|--resume] [--reset]
                       [--url URL] [--header NAME=VALUE]... [--signing-secret whsec_…]
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
		keyURL := fs.String("url", "", `the key's own URL, under the lane's target.http.job_urls ("" drops it)`)
		var headers headerFlags
		fs.Var(&headers, "header", "NAME=VALUE sent with the key's jobs (repeat; a name the lane forwards); --header= drops them")
		secret := fs.String("signing-secret", "", `the key's own Standard Webhooks secret, whsec_… ("" drops it; never shown)`)
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
			case "url":
				ch.URL = keyURL
			case "header":
				ch.Headers = headers.m
				if ch.Headers == nil {
					ch.Headers = map[string]string{}
				}
			case "signing-secret":
				ch.SigningSecret = secret
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
	// A key's own target, when it has one: its URL, the names of its
	// headers (values are never shown) and whether it has its own secret.
	for _, k := range keys {
		if k.URL == "" && len(k.Headers) == 0 && !k.SigningSecretSet {
			continue
		}
		fmt.Fprintf(w, "%s target: url=%s headers=%s signing_secret_set=%v\n", k.Key, orDash(k.URL), orDash(strings.Join(k.Headers, ",")), k.SigningSecretSet)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// headerFlags collects --header NAME=VALUE flags; an empty one (--header=)
// asks for no headers.
type headerFlags struct{ m map[string]string }

func (h *headerFlags) String() string { return "" }

func (h *headerFlags) Set(v string) error {
	if v == "" {
		return nil
	}
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q is not NAME=VALUE", v)
	}
	if h.m == nil {
		h.m = map[string]string{}
	}
	h.m[name] = value
	return nil
}
