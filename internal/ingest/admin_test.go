package ingest

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/throttler/throttler/api"

	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
)

// limitDir is a Directory with one lane, "demo", at 20/s burst 10; it
// records the limit it is given.
type limitDir struct {
	rate  float64
	burst int
	calls int
}

func (d *limitDir) Lane(name string) (Lane, bool) {
	return Lane{Admission: admission.Lane{Name: name, Limit: bucket.Limit{Rate: 20, Burst: 10}}}, name == "demo"
}

func (d *limitDir) Status(context.Context) []api.LaneStatus { return nil }

func (d *limitDir) SetLimit(_ context.Context, name string, rate float64, burst int) (api.LaneStatus, error) {
	d.rate, d.burst = rate, burst
	d.calls++
	return api.LaneStatus{Name: name, Rate: rate, Burst: burst}, nil
}

// TestSetLimitRateForms: PATCH takes rate as a number of jobs per second
// or as a string in the config's rate syntax, and names the field it
// refuses.
func TestSetLimitRateForms(t *testing.T) {
	steps := []struct {
		body  string
		rate  float64 // the rate set, when accepted
		burst int
		field string // the problem's field, when refused
	}{
		{`{"rate": 50}`, 50, 10, ""},
		{`{"rate": 0.5}`, 0.5, 10, ""},
		{`{"rate": "50/s"}`, 50, 10, ""},
		{`{"rate": "120/min"}`, 2, 10, ""},
		{`{"rate": " 5 / m ", "burst": 3}`, 5.0 / 60, 3, ""},
		{`{"burst": 3}`, 20, 3, ""},
		{`{"rate": "fast"}`, 0, 0, "rate"},
		{`{"rate": "20/w"}`, 0, 0, "rate"},
		{`{"rate": -1}`, 0, 0, "rate"},
		{`{"rate": 0}`, 0, 0, "rate"},
		{`{"rate": "2000000/s"}`, 0, 0, "rate"},
		{`{"rate": "0.000001"}`, 0, 0, "rate"}, // burst 10 at this rate: over 100 days to refill
		{`{"rate": "1/d", "burst": 1000000}`, 0, 0, "burst"},
		{`{"burst": 0}`, 0, 0, "burst"},
		{`{"rate": true}`, 0, 0, "rate"},
		{`{"rate": [1]}`, 0, 0, "rate"},
		{`{}`, 0, 0, "body"},
		{`{"rat": 5}`, 0, 0, "body"},
	}
	for _, s := range steps {
		t.Run(s.body, func(t *testing.T) {
			dir := &limitDir{}
			h := &Handler{cfg: Config{Lanes: dir, Logger: slog.New(slog.DiscardHandler)}}
			req := httptest.NewRequest("PATCH", "/v1/lanes/demo", strings.NewReader(s.body))
			req.SetPathValue("lane", "demo")
			rec := httptest.NewRecorder()
			h.admin(h.setLimit).ServeHTTP(rec, req)
			if s.field == "" {
				if rec.Code != 200 || dir.calls != 1 || dir.rate != s.rate || dir.burst != s.burst {
					t.Fatalf("status %d, SetLimit called %d times with %v/s burst %d; want %v/s burst %d: %s", rec.Code, dir.calls, dir.rate, dir.burst, s.rate, s.burst, rec.Body)
				}
				return
			}
			var p struct {
				Field  string `json:"field"`
				Detail string `json:"detail"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != 400 || p.Field != s.field || dir.calls != 0 {
				t.Fatalf("status %d, field %q (%v), SetLimit called %d times; want 400 naming %q: %s", rec.Code, p.Field, err, dir.calls, s.field, rec.Body)
			}
			t.Logf("%s", p.Detail)
		})
	}
}

// TestDecodeSmall: the one reader of the admin endpoints' small bodies
// (lane PATCH, key PUT, caller plans) names the field at fault, bounds the
// body, and gives its bytes back to the budget of bodies read at once.
func TestDecodeSmall(t *testing.T) {
	type change struct {
		Rate  *bucket.Rate `json:"rate"`
		Burst *int         `json:"burst"`
	}
	h := &Handler{bodies: newBudget(2*maxSmallBody, 0)}
	decode := func(body string, length int64) (*api.Problem, *httptest.ResponseRecorder) {
		req := httptest.NewRequest("PATCH", "/v1/lanes/demo", strings.NewReader(body))
		req.ContentLength = length
		rec := httptest.NewRecorder()
		var c change
		return h.decodeSmall(rec, req, &c, "a JSON object with rate and/or burst"), rec
	}
	steps := []struct {
		body   string
		length int64 // -1: unknown
		field  string
		detail string // the detail's start
	}{
		{`{"rate":"5/s","burst":2}`, -1, "", ""},
		{`{"rate":"5/w"}`, -1, "rate", `"5/w" is not a rate`},
		{`{"rat":5}`, -1, "body", `the body must be a JSON object with rate and/or burst: json: unknown field "rat"`},
		{`[1]`, -1, "body", "the body must be a JSON object with rate and/or burst: "},
		{`{"burst":` + strings.Repeat(" ", maxSmallBody) + `1}`, -1, "body", "the body must be a JSON object with rate and/or burst: http: request body too large"},
	}
	for _, s := range steps {
		p, _ := decode(s.body, s.length)
		switch {
		case s.field == "" && p != nil:
			t.Errorf("%.30s: %+v, want it decoded", s.body, p)
		case s.field != "" && (p == nil || p.Status != 400 || p.Type != ProblemBadBody || p.Field != s.field || !strings.HasPrefix(p.Detail, s.detail)):
			t.Errorf("%.30s: %+v, want 400 naming %s with a detail starting %q", s.body, p, s.field, s.detail)
		}
		if used := h.bodies.used.Load(); used != 0 {
			t.Fatalf("%.30s: %d bytes of the budget still held after the decode", s.body, used)
		}
	}
	// The budget full: 503 naming max_body_inflight, and the connection
	// closes rather than read the body.
	release, full := h.bodies.take(bodyCaller{key: "other"}, 2*maxSmallBody-10, maxSmallBody*2)
	if full != budgetOK {
		t.Fatal("could not fill the budget")
	}
	p, rec := decode(`{"burst":1}`, -1)
	if p == nil || p.Status != 503 || p.Field != "max_body_inflight" || rec.Header().Get("Connection") != "close" {
		t.Errorf("budget full: %+v (Connection %q), want 503 naming max_body_inflight", p, rec.Header().Get("Connection"))
	}
	if p, _ := decode(`{"burst":1}`, 11); p == nil || p.Status != 503 {
		t.Errorf("budget full: %+v for a body of 11 bytes, 10 free; want a 503", p)
	}
	release()
	if p, _ := decode(`{"burst":1}`, 11); p != nil {
		t.Errorf("budget free again: %+v", p)
	}
}
