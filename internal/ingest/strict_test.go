package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
)

// countingKeys is a KeyDirectory that counts the changes it stores.
type countingKeys struct{ set atomic.Int64 }

func (k *countingKeys) KeyStatus(_ context.Context, lane, key string) (api.KeyStatus, error) {
	return api.KeyStatus{Lane: lane, Key: key, Rate: 1, Burst: 1}, nil
}

func (k *countingKeys) SetKey(_ context.Context, lane, key string, c KeyChange, _ string) (api.KeyStatus, error) {
	k.set.Add(1)
	return api.KeyStatus{Lane: lane, Key: key, Rate: 1, Burst: 1}, nil
}

// TestStrictJSONEveryBody: every JSON body the API reads refuses a key given
// twice, a key in another case than its field's, an unknown key, data after
// the value and a string that is not UTF-8, with a 400 naming the field or
// its JSON pointer; nothing is changed or stored. The same bodies written
// strictly are taken.
func TestStrictJSONEveryBody(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	keys := &countingKeys{}
	f := callerFixture(t, c, func(cfg *Config) { cfg.Keys = keys })
	const bad = "\xff\xfe"
	type step struct {
		name, body, field string
	}
	for _, ep := range []struct {
		method, path, key string
		ok                string // a strict body the endpoint takes
		steps             []step
		changed           func() int64
	}{
		{"PATCH", "/v1/lanes/demo", "admin", `{"rate":"5/s","burst":2}`, []step{
			{"Duplicate", `{"burst":2,"burst":3}`, "burst"},
			{"DuplicateEscaped", `{"burst":2,"b\u0075rst":3}`, "burst"},
			{"Miscased", `{"Burst":2}`, "Burst"},
			{"Unknown", `{"burst":2,"colour":1}`, "body"},
			{"Trailing", `{"burst":2} {"burst":3}`, "body"},
			{"TrailingGarbage", `{"burst":2}x`, "body"},
			{"InvalidUTF8", `{"rate":"5/s` + bad + `"}`, "rate"},
			{"InvalidUTF8Key", `{"rate` + bad + `":1}`, "rate\ufffd\ufffd"}, // the pointer holds the key as decoded
			{"WrongType", `{"burst":"2"}`, "burst"},
		}, func() int64 { return f.dir.setLimit.Load() }},
		{"PATCH", "/v1/lanes/demo/keys/k1", "admin", `{"paused":true}`, []step{
			{"Duplicate", `{"paused":true,"paused":false}`, "paused"},
			{"Miscased", `{"PAUSED":true}`, "PAUSED"},
			{"Unknown", `{"pause":true}`, "body"},
			{"Trailing", `{"paused":true}]`, "body"},
			{"InvalidUTF8", `{"paused":true,"rate":"1/s` + bad + `"}`, "rate"},
		}, func() int64 { return keys.set.Load() }},
		{"PUT", "/v1/callers/plans/gold", "admin", `{"rate":"1/min","burst":1}`, []step{
			{"Duplicate", `{"rate":"1/min","rate":"9/s"}`, "rate"},
			{"Miscased", `{"rate":"1/min","Observe":true}`, "Observe"},
			{"Unknown", `{"rate":"1/min","burts":1}`, "body"},
			{"Trailing", `{"rate":"1/min"} 1`, "body"},
			{"InvalidUTF8", `{"rate":"1/min` + bad + `"}`, "rate"},
		}, nil},
		{"PUT", "/v1/callers/keys/shop/plan", "admin", `{"plan":"free"}`, []step{
			{"Duplicate", `{"plan":"free","plan":"anonymous"}`, "plan"},
			{"Miscased", `{"Plan":"free"}`, "Plan"},
			{"Unknown", `{"plan":"free","key":"x"}`, "body"},
			{"Trailing", `{"plan":"free"}{}`, "body"},
			{"InvalidUTF8", `{"plan":"fr` + bad + `ee"}`, "plan"},
		}, nil},
		{"POST", "/v1/lanes/demo/jobs:batch", "admin", `[{"idempotency_key":"a","payload":{"n":1}}]`, []step{
			{"Duplicate", `[{"payload":1},{"payload":1,"payload":2}]`, "/1/payload"},
			{"DuplicateKey", `[{"idempotency_key":"a","payload":1,"idempotency_key":"b"}]`, "/0/idempotency_key"},
			{"Miscased", `[{"payload":1,"Idempotency_Key":"a"}]`, "/0/Idempotency_Key"},
			{"MiscasedEscaped", `[{"payload":1,"Content_type\u0000":"a"}]`, "/0/Content_type\x00"},
			{"Unknown", `[{"payload":1,"paylod":2}]`, "/0/paylod"},
			{"Trailing", `[{"payload":1}][]`, "body"},
			{"InvalidUTF8Payload", `[{"payload":1},{"payload":{"a":"` + bad + `"}}]`, "/1/payload"},
			{"InvalidUTF8PayloadEscaped", `[{"payload":{"a\"":"\u00e9` + bad + `"}}]`, "/0/payload"},
			{"InvalidUTF8Key", `[{"payload":1,"idempotency_key":"a` + bad + `"}]`, "/0/idempotency_key"},
			{"InvalidUTF8ContentType", `[{"payload":1,"content_type":"text/plain; x=` + bad + `"}]`, "/0/content_type"},
		}, func() int64 { return int64(f.pub.n.Load()) }},
	} {
		t.Run(ep.method+ep.path, func(t *testing.T) {
			var before int64
			if ep.changed != nil {
				before = ep.changed()
			}
			for _, s := range ep.steps {
				rec := do(f.h, ep.method, ep.path, "secret-"+ep.key, s.body, map[string]string{"Content-Type": "application/json"})
				p := readProblem(t, rec)
				if rec.Code != http.StatusBadRequest || p.Type != ProblemBadBody || p.Field != s.field || p.Detail == "" {
					t.Errorf("%s: %d %+v, want 400 %s naming %q", s.name, rec.Code, p, ProblemBadBody, s.field)
				}
			}
			if ep.changed != nil {
				if n := ep.changed() - before; n != 0 {
					t.Errorf("refused bodies changed or stored %d times", n)
				}
			}
			if rec := do(f.h, ep.method, ep.path, "secret-"+ep.key, ep.ok, map[string]string{"Content-Type": "application/json"}); rec.Code >= 300 {
				t.Errorf("strict body %s: %d %s", ep.ok, rec.Code, rec.Body)
			}
		})
	}
}

// TestJSONPayloadMustBeUTF8: a job sent as JSON (application/json, a +json
// type) must be valid UTF-8; other types carry any bytes.
func TestJSONPayloadMustBeUTF8(t *testing.T) {
	f := newFixture(t, nil)
	for _, tc := range []struct {
		ct, body string
		status   int
	}{
		{"application/json", `{"a":"é"}`, 202},
		{"application/json", "{\"a\":\"\xe9\"}", 400},
		{"Application/JSON; charset=utf-8", "\"\xc3\x28\"", 400},
		{"application/problem+json", "\"\xed\xa0\x80\"", 400}, // a surrogate
		{"application/octet-stream", "\xff\xfe", 202},
		{"text/plain", "\xe9t\xe9", 202},
		{"", "\xff", 202},
	} {
		before := f.pub.n.Load()
		rec := do(f.h, "POST", "/v1/lanes/demo/jobs", "", tc.body, map[string]string{"Content-Type": tc.ct})
		if rec.Code != tc.status {
			t.Errorf("%q %q: %d %s, want %d", tc.ct, tc.body, rec.Code, rec.Body, tc.status)
			continue
		}
		if tc.status == 400 {
			if p := readProblem(t, rec); p.Type != ProblemBadBody || p.Field != "body" {
				t.Errorf("%q: %+v, want %s naming body", tc.body, p, ProblemBadBody)
			}
			if f.pub.n.Load() != before {
				t.Errorf("%q: refused and stored", tc.body)
			}
		}
	}
}

// TestContentTypeASCII: a Content-Type with a byte that is not visible
// ASCII (or a space or tab) is refused, on a job and on a batch, with a
// 400 naming Content-Type; nothing is stored.
func TestContentTypeASCII(t *testing.T) {
	f := newFixture(t, nil)
	for _, ct := range []string{"text/plàin", "application/json; charset=\xff", "text/plain\x7f", "application/json; x=\"é\""} {
		for _, path := range []string{"/v1/lanes/demo/jobs", "/v1/lanes/demo/jobs:batch"} {
			rec := do(f.h, "POST", path, "", `[{"payload":1}]`, map[string]string{"Content-Type": ct})
			p := readProblem(t, rec)
			if rec.Code != 400 || p.Type != ProblemBadHeader || p.Field != "Content-Type" {
				t.Errorf("%s %q: %d %+v, want 400 %s naming Content-Type", path, ct, rec.Code, p, ProblemBadHeader)
			}
		}
	}
	if n := f.pub.n.Load(); n != 0 {
		t.Fatalf("refused jobs stored: %d", n)
	}
	for _, ct := range []string{"text/plain", "application/json;\tcharset=utf-8"} {
		if rec := do(f.h, "POST", "/v1/lanes/demo/jobs", "", `1`, map[string]string{"Content-Type": ct}); rec.Code != 202 {
			t.Errorf("%q: %d %s, want 202", ct, rec.Code, rec.Body)
		}
	}
}

// TestEchoBound: a 1 MB lane name, key or field name written back into a
// problem or a log line is cut to maxEcho bytes: the answer and the log
// stay small, on the job, batch, admin and caller-quota paths.
func TestEchoBound(t *testing.T) {
	huge := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a character
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name          string
		callers       bool
		method, path  string
		secret, body  string
		status        int
		hdr           map[string]string
		wantInProblem string
	}{
		{"JobUnknownLane", false, "POST", "/v1/lanes/" + huge + "/jobs", "", "{}", 404, nil, "no lane named"},
		{"BatchUnknownLane", false, "POST", "/v1/lanes/" + huge + "/jobs:batch", "", "[]", 404, nil, "no lane named"},
		{"AdminUnknownLane", false, "PATCH", "/v1/lanes/" + huge, "", `{"rate":1}`, 404, nil, "no lane named"},
		{"NoRoute", false, "GET", "/" + huge, "", "", 404, nil, "no route"},
		{"BatchUnknownField", false, "POST", "/v1/lanes/demo/jobs:batch", "", `[{"payload":1,"` + huge + `":1}]`, 400, nil, "unknown field"},
		{"AdminUnknownField", false, "PATCH", "/v1/lanes/demo", "", `{"` + huge[:3000] + `":1}`, 400, nil, "unknown field"},
		{"UnknownKey", true, "POST", "/v1/lanes/" + huge + "/jobs", "secret-" + huge, "{}", 401, nil, "not known"},
		{"UnknownHost", false, "GET", "/v1/lanes", "", "", 421, map[string]string{"Host": huge}, "does not answer"},
		{"CrossOrigin", false, "POST", "/v1/lanes/demo/jobs", "", "{}", 403, map[string]string{"Origin": "http://" + huge}, "Origin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f *fixture
			if tc.callers {
				f = callerFixture(t, c, nil)
			} else {
				f = newFixture(t, nil)
			}
			rec := do(f.h, tc.method, tc.path, tc.secret, tc.body, tc.hdr)
			if rec.Code != tc.status {
				t.Fatalf("%d, want %d: %.300s", rec.Code, tc.status, rec.Body)
			}
			var p api.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatalf("problem: %v", err)
			}
			if !strings.Contains(p.Detail, tc.wantInProblem) {
				t.Errorf("detail %q does not say %q", p.Detail, tc.wantInProblem)
			}
			if n := rec.Body.Len(); n > 2048 {
				t.Errorf("the problem is %d bytes: %.300s", n, rec.Body)
			}
			for _, s := range []string{p.Instance, p.Lane, p.Field} {
				if len(s) > maxEcho || !utf8.ValidString(s) {
					t.Errorf("a problem member of %d bytes (valid UTF-8: %v): %.200q", len(s), utf8.ValidString(s), s)
				}
			}
			logs := f.logs.String()
			if logs == "" && tc.status != 404 && tc.method == "POST" {
				t.Error("nothing was logged")
			}
			for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
				if len(line) > 2048 {
					t.Errorf("a log line of %d bytes: %.300s", len(line), line)
				}
			}
		})
	}
}

// TestDecodeStrict: the strict decoder's rows, one by one: what it refuses,
// why and where; what it takes decodes as encoding/json decodes it.
func TestDecodeStrict(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type body struct {
		Rate    *bucket.Rate      `json:"rate"`
		Burst   *int              `json:"burst"`
		Name    string            `json:"name,omitempty"`
		Skip    string            `json:"-"`
		Plain   bool              // no tag: its Go name, exactly
		In      inner             `json:"in"`
		List    []inner           `json:"list"`
		Tags    map[string]string `json:"tags"`
		Payload json.RawMessage   `json:"payload"`
		Any     any               `json:"any"`
	}
	bad := "\xff"
	steps := []struct {
		in      string
		reason  string // "" taken
		pointer string
	}{
		{`{"rate":"5/s","burst":2,"name":"x","Plain":true,"in":{"n":1},"list":[{"n":1},{"n":2}],"tags":{"a":"b","A":"c"},"payload":{"x":1,"x":2},"any":[1,{"y":1,"y":2}]}`, "", ""},
		{` {} `, "", ""},
		{`null`, "", ""},
		{`{"burst":1,"burst":1}`, jsonDuplicate, "/burst"},
		{`{"in":{"n":1,"\u006e":2}}`, jsonDuplicate, "/in/n"},
		{`{"tags":{"a":"1","a":"2"}}`, jsonDuplicate, "/tags/a"},
		{`{"list":[{"n":1},{"N":2}]}`, jsonMiscased, "/list/1/N"},
		{`{"plain":true}`, jsonMiscased, "/plain"},
		{`{"NAME":"x"}`, jsonMiscased, "/NAME"},
		{`{"Skip":"x"}`, jsonUnknown, "/Skip"},
		{`{"-":"x"}`, jsonUnknown, "/-"},
		{`{"in":{"m":1}}`, jsonUnknown, "/in/m"},
		{`{"a/b~c":1}`, jsonUnknown, "/a~1b~0c"},
		{`{}{}`, jsonTrailing, ""},
		{`{} x`, jsonTrailing, ""},
		{`{}]`, jsonTrailing, ""},
		{`{"name":"` + bad + `"}`, jsonUTF8, "/name"},
		{`{"tags":{"k":"\u00e9` + bad + `"}}`, jsonUTF8, "/tags/k"},
		{`{"payload":["` + bad + `"]}`, jsonUTF8, "/payload"},
		{`{"any":{"` + bad + `":1}}`, jsonUTF8, "/any"},
		{`{"name` + bad + `":1}`, jsonUTF8, "/name\ufffd"},
		{`{"burst":"1"}`, jsonType, "/burst"},
		{`{"in":{"n":"1"}}`, jsonType, "/in/n"},
		{`[1]`, jsonType, ""},
		{`{"burst":1`, jsonSyntax, ""},
		{`{"burst":01}`, jsonSyntax, ""},
		{``, jsonSyntax, ""},
	}
	for _, s := range steps {
		var got body
		err := decodeStrict([]byte(s.in), &got)
		var je *JSONError
		switch {
		case s.reason == "" && err != nil:
			t.Errorf("%q: %v, want it taken", s.in, err)
		case s.reason == "":
			var want body
			if err := json.Unmarshal([]byte(s.in), &want); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%q: %+v, encoding/json %+v (%v)", s.in, got, want, err)
			}
		case !errors.As(err, &je) || !errors.Is(err, ErrStrictJSON):
			t.Errorf("%q: %v, want a *JSONError (%s)", s.in, err, s.reason)
		case je.Reason != s.reason || je.Pointer != s.pointer:
			t.Errorf("%q: %s at %q (%v), want %s at %q", s.in, je.Reason, je.Pointer, err, s.reason, s.pointer)
		}
	}
	// A rate that does not parse keeps bucket's error.
	var b body
	if err := decodeStrict([]byte(`{"rate":"5/w"}`), &b); !errors.Is(err, bucket.ErrInvalidRate) {
		t.Errorf("bad rate: %v, want bucket.ErrInvalidRate", err)
	}
}

// FuzzDecodeStrict: what the strict decoder takes is valid JSON in valid
// UTF-8 with no data after it, and decodes as encoding/json decodes it;
// what it refuses is a *JSONError, or the error of a value that decodes
// itself. It never panics.
func FuzzDecodeStrict(f *testing.F) {
	for _, s := range []string{
		`{"rate":"5/s","burst":2}`, `{"burst":1,"burst":2}`, `{"Burst":1}`, `{"rate":1} x`, `{"rate":"\u00e9"}`,
		"{\"rate\":\"\xff\"}", `[{"payload":1}]`, `{"items":[{"payload":{"a":[1,2,{"b":null}]},"idempotency_key":"k"}]}`,
		`{"items":[{"PAYLOAD":1}]}`, `{"tags":{"a":1,"a":2}}`, `null`, `{}`, `{"paused":true,"reset":false}`, `{"weight":1e400}`,
		`{"items":[{"payload":"` + strings.Repeat("[", 20) + `"}]}`, `{"in":{"n":1}}`,
	} {
		f.Add([]byte(s))
	}
	type target struct {
		Rate   *bucket.Rate      `json:"rate"`
		Burst  *int              `json:"burst"`
		Weight *float64          `json:"weight"`
		Paused *bool             `json:"paused"`
		Reset  bool              `json:"reset"`
		Items  []api.BatchItem   `json:"items"`
		Tags   map[string]string `json:"tags"`
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got target
		err := decodeStrict(data, &got)
		if err != nil {
			var je *JSONError
			if !errors.As(err, &je) && !errors.Is(err, bucket.ErrInvalidRate) && !errors.Is(err, bucket.ErrInvalidLimit) {
				t.Fatalf("%q: %v (%T) is neither a *JSONError nor a rate's error", data, err, err)
			}
			return
		}
		if !json.Valid(data) || !utf8.Valid(data) {
			t.Fatalf("%q: taken, but not valid JSON in UTF-8", data)
		}
		var want target
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil || dec.More() {
			t.Fatalf("%q: taken, encoding/json refuses: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %+v, encoding/json %+v", data, got, want)
		}
	})
}

// FuzzClip: the echo cutter returns a short string as it is, and cuts a
// long one to a prefix ending with the marker, at most maxEcho bytes in
// all, valid UTF-8 when the input was.
func FuzzClip(f *testing.F) {
	for _, s := range []string{"", "demo", strings.Repeat("a", maxEcho), strings.Repeat("a", maxEcho+1),
		strings.Repeat("é", 100), strings.Repeat("a", maxEcho-4) + "😀😀", strings.Repeat("\xff", 200), "a\x80\x80\x80\x80\x80" + strings.Repeat("b", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := clip(s)
		if len(s) <= maxEcho {
			if got != s {
				t.Fatalf("%q cut to %q", s, got)
			}
			return
		}
		body, ok := strings.CutSuffix(got, echoCut)
		switch {
		case len(got) > maxEcho:
			t.Fatalf("%q cut to %d bytes", s, len(got))
		case !ok || !strings.HasPrefix(s, body):
			t.Fatalf("%q cut to %q: not a prefix and the marker", s, got)
		case len(body) < maxEcho-len(echoCut)-utf8.UTFMax:
			t.Fatalf("%q cut to %q: %d bytes kept, too few", s, got, len(body))
		case utf8.ValidString(s) && !utf8.ValidString(got):
			t.Fatalf("%q cut to %q: no longer valid UTF-8", s, got)
		}
	})
}
