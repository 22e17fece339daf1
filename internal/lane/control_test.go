package lane

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

var testBounds = controlBounds{MaxPause: time.Hour, MinFactor: 0.1, MinRate: 1, MaxRate: 100, MaxBurst: 50}

func TestParseControl(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     control
		err      string
	}{
		{"pause", `{"v":1,"kind":"pause","pause_ms":2000,"from":"a"}`, control{V: 1, Kind: kindPause, PauseMillis: 2000, From: "a"}, ""},
		{"pause at the maximum", `{"v":1,"kind":"pause","pause_ms":3600000}`, control{V: 1, Kind: kindPause, PauseMillis: 3600000}, ""},
		{"pause over the downstream maximum", `{"v":1,"kind":"pause","pause_ms":3600001}`, control{}, "not in (0, 1h0m0s]"},
		{"year-2319 pause", `{"v":1,"kind":"pause","pause_ms":9999999999999}`, control{}, "not in (0"},
		{"zero pause", `{"v":1,"kind":"pause","pause_ms":0}`, control{}, "not in (0"},
		{"negative pause", `{"v":1,"kind":"pause","pause_ms":-5}`, control{}, "not in (0"},
		{"factor", `{"v":1,"kind":"factor","factor":0.5}`, control{V: 1, Kind: kindFactor, Factor: 0.5}, ""},
		{"factor below adaptive.min", `{"v":1,"kind":"factor","factor":0.01}`, control{}, "not in [0.1, 1]"},
		{"factor above 1", `{"v":1,"kind":"factor","factor":2}`, control{}, "not in [0.1, 1]"},
		{"limit", `{"v":1,"kind":"limit","rate":50,"burst":10}`, control{V: 1, Kind: kindLimit, Rate: 50, Burst: 10}, ""},
		{"tiny rate", `{"v":1,"kind":"limit","rate":0.000001,"burst":1}`, control{}, "not in the lane's range"},
		{"rate over the range", `{"v":1,"kind":"limit","rate":101,"burst":1}`, control{}, "not in the lane's range"},
		{"burst over the range", `{"v":1,"kind":"limit","rate":10,"burst":51}`, control{}, "over the lane's maximum"},
		{"zero burst", `{"v":1,"kind":"limit","rate":10,"burst":0}`, control{}, "burst must be between 1 and"},
		{"unknown kind", `{"v":1,"kind":"reboot"}`, control{}, `unknown control kind "reboot"`},
		{"old text protocol", `pause 100`, control{}, "not JSON"},
		{"unknown version", `{"v":2,"kind":"pause","pause_ms":1}`, control{}, "unknown control message version 2"},
		{"no version", `{"kind":"pause","pause_ms":1}`, control{}, "unknown control message version 0"},
		{"too big", `{"v":1,"kind":"pause","from":"` + strings.Repeat("x", maxControlSize) + `"}`, control{}, "is over 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseControl([]byte(tc.in), testBounds)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseControl = %+v, %v; want an error saying %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseControl = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if _, err := parseControl([]byte(`{"v":1,"kind":"factor","factor":0.5}`), controlBounds{MaxPause: time.Hour}); err == nil {
		t.Fatal("a factor for a lane that is not adaptive was taken")
	}
	if _, err := parseControl([]byte(`{"v":3}`), testBounds); !errors.Is(err, errUnknownVersion) {
		t.Fatalf("unknown version error %v does not match errUnknownVersion", err)
	}
}

func TestControlRoundTrip(t *testing.T) {
	for _, c := range []control{
		{Kind: kindPause, PauseMillis: 1500, From: "i1"},
		{Kind: kindFactor, Factor: 0.25},
		{Kind: kindLimit, Rate: 12.5, Burst: 3},
	} {
		got, err := parseControl(c.encode(), testBounds)
		c.V = controlVersion
		if err != nil || got != c {
			t.Fatalf("round trip of %+v = %+v, %v", c, got, err)
		}
	}
}

// FuzzParseControl: no input panics, and whatever is accepted stays inside
// the bounds.
func FuzzParseControl(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"kind":"pause","pause_ms":2000}`, `{"v":1,"kind":"factor","factor":0.5}`,
		`{"v":1,"kind":"limit","rate":50,"burst":10}`, `pause 100`, `{"v":2}`, `{}`, ``,
		`{"v":1,"kind":"limit","rate":1e308,"burst":-1}`, `{"v":1,"kind":"pause","pause_ms":-9223372036854775808}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseControl(data, testBounds)
		if err != nil {
			return
		}
		switch c.Kind {
		case kindPause:
			if d := time.Duration(c.PauseMillis) * time.Millisecond; d <= 0 || d > testBounds.MaxPause {
				t.Fatalf("accepted pause %v", d)
			}
		case kindFactor:
			if !(c.Factor >= testBounds.MinFactor && c.Factor <= 1) {
				t.Fatalf("accepted factor %v", c.Factor)
			}
		case kindLimit:
			if (bucket.Limit{Rate: c.Rate, Burst: c.Burst}).Validate() != nil || c.Rate < testBounds.MinRate || c.Rate > testBounds.MaxRate || c.Burst > testBounds.MaxBurst {
				t.Fatalf("accepted limit %v/%d", c.Rate, c.Burst)
			}
		default:
			t.Fatalf("accepted kind %q", c.Kind)
		}
		if _, err := json.Marshal(c); err != nil {
			t.Fatal(err)
		}
	})
}
