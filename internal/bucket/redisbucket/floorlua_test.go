package redisbucket_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket/redisbucket"
)

// TestFloorPaths calls the scripts with floors of their own, at a fixed now,
// for every path of the lane's floor (ARGV[6], every script) and the key's
// (ARGV[11], the pair script): a floor that is not a tat, one at or behind
// now, one ahead of a missing, an older or a newer state, and one closer
// than an empty bucket. Store only ever sends the floors it saw; a restore
// it would not trigger is still pinned here.
func TestFloorPaths(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	const nowUS = 1767323045000000
	// at is now + d in the state format.
	at := func(d time.Duration) string {
		ns := d.Nanoseconds()
		us, frac := nowUS+ns/1000, ns%1000
		if frac < 0 {
			us, frac = us-1, frac+1000
		}
		return fmt.Sprintf("%d.%03d", us, frac)
	}
	const (
		laneKey = "thr:{floors}:gcra"
		keyKey  = "thr:{floors}:gcra:k"
		T       = int64(100 * time.Millisecond) // the lane: 10/s burst 2
		tau     = int64(100 * time.Millisecond)
		kT      = int64(time.Second) // the key: 1/s burst 1
		kTau    = int64(0)
		lead    = int64(time.Minute) // the key's allowed lead (ARGV[4])
	)
	run := func(t *testing.T, script *redis.Script, keys []string, state map[string]string, args ...any) ([]any, error) {
		t.Helper()
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for k, v := range state {
			if err := client.Set(ctx, k, v, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
		reply, err := script.Run(ctx, client, keys, args...).Slice()
		return reply, err
	}
	check := func(t *testing.T, reply []any, err error, want []any, stored map[string]string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(reply, want) {
			t.Errorf("reply %q, want %q", reply, want)
		}
		for k, v := range stored {
			if got, err := client.Get(ctx, k).Result(); err != nil || got != v {
				t.Errorf("%s holds %q (%v), want %q", k, got, err, v)
			}
		}
	}

	t.Run("Lane", func(t *testing.T) {
		// ARGV of Admit: now, T, τ, n, extra TTL, floor, held.
		for _, tc := range []struct {
			name  string
			state string // the lane's state before, "" for none
			floor string
			held  int64
			want  []any // {allowed, tat − now, tat, restored}
		}{
			{"NoFloor", "", "", 0, []any{int64(1), "100000000", at(100 * time.Millisecond), int64(0)}},
			{"FloorBehindNow", "", at(-time.Second), 0, []any{int64(1), "100000000", at(100 * time.Millisecond), int64(0)}},
			{"FloorAtNow", "", at(0), 0, []any{int64(1), "100000000", at(100 * time.Millisecond), int64(0)}},
			{"FloorAheadOfMissing", "", at(5 * time.Second), 0, []any{int64(0), "5000000000", at(5 * time.Second), int64(1)}},
			{"FloorAheadWithHeld", "", at(5 * time.Second), 3e8, []any{int64(0), "5300000000", at(5300 * time.Millisecond), int64(1)}},
			{"FloorAheadOfOlder", at(time.Second), at(5 * time.Second), 0, []any{int64(0), "5000000000", at(5 * time.Second), int64(1)}},
			{"FloorBehindNewer", at(6 * time.Second), at(5 * time.Second), 0, []any{int64(0), "6000000000", at(6 * time.Second), int64(0)}},
			{"FloorEqualsState", at(5 * time.Second), at(5 * time.Second), 0, []any{int64(0), "5000000000", at(5 * time.Second), int64(0)}},
			// An empty bucket is at least τ + T ahead.
			{"FloorCloserThanEmpty", "", at(time.Millisecond + 7), 0, []any{int64(0), "200000000", at(200 * time.Millisecond), int64(1)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				state := map[string]string{}
				if tc.state != "" {
					state[laneKey] = tc.state
				}
				reply, err := run(t, redisbucket.AdmitScript, []string{laneKey}, state, at(0), T, tau, 1, 0, tc.floor, tc.held)
				check(t, reply, err, tc.want, map[string]string{laneKey: tc.want[2].(string)})
			})
		}
	})

	t.Run("Pair", func(t *testing.T) {
		// ARGV of ReservePair: now, T, τ, lead, extra TTL, lane floor,
		// held, the key's T and τ, carry, key floor.
		for _, tc := range []struct {
			name              string
			key               string // the key's state before, "" for none
			laneFloor, kFloor string
			held, carry, lead int64
			want              []any // {ok, due, key next, lane next, key latest, key tat', lane tat', restored}
			stored            string
		}{
			{"NoFloor", "", "", "", 0, 0, lead,
				[]any{int64(1), "0", "1000000000", "0", "0", at(time.Second), at(100 * time.Millisecond), int64(0)}, at(time.Second)},
			{"KeyFloorBehindNow", "", "", at(-time.Second), 0, 0, lead,
				[]any{int64(1), "0", "1000000000", "0", "0", at(time.Second), at(100 * time.Millisecond), int64(0)}, at(time.Second)},
			{"KeyFloorAheadOfMissing", "", "", at(5 * time.Second), 0, 0, lead,
				[]any{int64(1), "5000000000", "6000000000", "5000000000", "5000000000", at(6 * time.Second), at(5100 * time.Millisecond), int64(2)}, at(6 * time.Second)},
			{"KeyFloorAheadOfOlder", at(time.Second), "", at(5 * time.Second), 0, 0, lead,
				[]any{int64(1), "5000000000", "6000000000", "5000000000", "5000000000", at(6 * time.Second), at(5100 * time.Millisecond), int64(2)}, at(6 * time.Second)},
			{"KeyFloorBehindNewer", at(6 * time.Second), "", at(5 * time.Second), 0, 0, lead,
				[]any{int64(1), "6000000000", "7000000000", "6000000000", "6000000000", at(7 * time.Second), at(6100 * time.Millisecond), int64(0)}, at(7 * time.Second)},
			// The carry counts before the floor: 1 s + 4.5 s is past it.
			{"CarryPastKeyFloor", at(time.Second), "", at(5 * time.Second), 0, int64(4500 * time.Millisecond), lead,
				[]any{int64(1), "5500000000", "6500000000", "5500000000", "5500000000", at(6500 * time.Millisecond), at(5600 * time.Millisecond), int64(0)}, at(6500 * time.Millisecond)},
			// An empty bucket of the key is at least its τ + T ahead.
			{"KeyFloorCloserThanEmpty", "", "", at(time.Millisecond), 0, 0, lead,
				[]any{int64(1), "1000000000", "2000000000", "1000000000", "1000000000", at(2 * time.Second), at(1100 * time.Millisecond), int64(2)}, at(2 * time.Second)},
			// No slot (the key leads the lane by more than 1 s): the
			// restored key is written all the same.
			{"KeyRestoredWithoutSlot", "", "", at(5 * time.Second), 0, 0, int64(time.Second),
				[]any{int64(0), "0", "5000000000", "0", "0", "", "", int64(2)}, at(5 * time.Second)},
			// Both restored (1 + 2); held is the lane's, never the key's.
			{"BothFloorsAhead", "", at(3 * time.Second), at(5 * time.Second), 2e8, 0, lead,
				[]any{int64(1), "5000000000", "6000000000", "5000000000", "5000000000", at(6 * time.Second), at(5100 * time.Millisecond), int64(3)}, at(6 * time.Second)},
			{"LaneFloorWithHeld", "", at(3 * time.Second), "", 2e8, 0, lead,
				[]any{int64(1), "3100000000", "4100000000", "3200000000", "3100000000", at(4100 * time.Millisecond), at(3300 * time.Millisecond), int64(1)}, at(4100 * time.Millisecond)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				state := map[string]string{}
				if tc.key != "" {
					state[keyKey] = tc.key
				}
				reply, err := run(t, redisbucket.PairScript, []string{laneKey, keyKey}, state,
					at(0), T, tau, tc.lead, 0, tc.laneFloor, tc.held, kT, kTau, tc.carry, tc.kFloor)
				check(t, reply, err, tc.want, map[string]string{keyKey: tc.stored})
			})
		}
	})

	t.Run("BadFloor", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			script *redis.Script
			keys   []string
			args   []any
			want   string
		}{
			{"Lane", redisbucket.AdmitScript, []string{laneKey}, []any{at(0), T, tau, 1, 0, "12.5", 0},
				`bad floor argument ARGV[6] "12.5", want µs.nnn`},
			{"PairLane", redisbucket.PairScript, []string{laneKey, keyKey},
				[]any{at(0), T, tau, lead, 0, "soon", 0, kT, kTau, 0, ""},
				`bad floor argument ARGV[6] "soon", want µs.nnn`},
			{"PairKey", redisbucket.PairScript, []string{laneKey, keyKey},
				[]any{at(0), T, tau, lead, 0, "", 0, kT, kTau, 0, "1.2345"},
				`bad key floor argument ARGV[11] "1.2345", want µs.nnn`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := run(t, tc.script, tc.keys, nil, tc.args...)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one containing %s", err, tc.want)
				}
				if n, err := client.DBSize(ctx).Result(); err != nil || n != 0 {
					t.Fatalf("%d keys written before the error (%v), want none", n, err)
				}
			})
		}
	})
}
