package bucket_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/throttler/throttler/internal/bucket"
)

// FuzzParseRate: ParseRate never panics; a refusal is a *RateError of at
// most 64 bytes of input; an accepted rate reads back from its canonical
// form, is finite and not negative, gives a whole-number Quota that agrees
// with PerSecond, and reads the same from a JSON string.
func FuzzParseRate(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		r, err := bucket.ParseRate(s)
		if err != nil {
			var re *bucket.RateError
			if !errors.As(err, &re) || !errors.Is(err, bucket.ErrInvalidRate) || len(re.Text) > 64 {
				t.Fatalf("ParseRate(%q) = %v: not a *RateError of at most 64 bytes", s, err)
			}
			return
		}
		back, err := bucket.ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseRate(%q) = %s; reading that back gives %v, %v", s, r, back, err)
		}
		ps := r.PerSecond()
		if math.IsNaN(ps) || math.IsInf(ps, 0) || ps < 0 || (ps == 0) != r.IsZero() {
			t.Fatalf("%q: PerSecond = %v", s, ps)
		}
		count, window := r.Quota()
		if window <= 0 || count < 0 || math.Abs(count/window.Seconds()-ps) > 1e-9*ps {
			t.Fatalf("%q: Quota = %v per %v, PerSecond %v", s, count, window, ps)
		}
		quoted, _ := json.Marshal(s)
		var fromJSON bucket.Rate
		if err := json.Unmarshal(quoted, &fromJSON); err != nil || fromJSON != r {
			t.Fatalf("JSON %q gives %v, %v; ParseRate gives %s", s, fromJSON, err, r)
		}
	})
}
