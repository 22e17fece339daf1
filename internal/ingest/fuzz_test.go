package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/throttler/throttler/api"
)

// FuzzHandler sends fuzzed requests (method, path, headers, body) through
// the whole handler on fakes, with keys and auth.hosts set: whatever comes
// in, the answer is never a 5xx other than 503, and nothing panics. The
// seed corpus is in testdata/fuzz/FuzzHandler; headers are "Name: value"
// lines, and "Host: …" sets the Host.
//
//	go test -run='^$' -fuzz=FuzzHandler ./internal/ingest/
func FuzzHandler(f *testing.F) {
	fx := newFixture(f, func(c *Config) {
		c.Auth.Keys = tableKeys
		c.Auth.Hosts = []string{"localhost", "api.example:8443"}
		c.MaxBodyInflight = 4 << 10
	})
	open := newFixture(f, nil)
	f.Fuzz(func(t *testing.T, method, path, headers string, body []byte) {
		if !validMethod(method) {
			return // the server refuses it before any handler
		}
		u, err := url.ParseRequestURI(path)
		if err != nil {
			return
		}
		r := (&http.Request{
			Method: method, URL: u, RequestURI: path, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Host: "localhost", RemoteAddr: "192.0.2.1:1234",
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		}).WithContext(context.Background())
		for line := range strings.SplitSeq(headers, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if strings.EqualFold(k, "Host") {
				r.Host = v
				continue
			}
			r.Header.Add(k, v)
		}
		for _, h := range []*Handler{fx.h, open.h} {
			rec := httptest.NewRecorder()
			r.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(rec, r)
			if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("%s %s with %q: %d %s", method, path, headers, rec.Code, rec.Body)
			}
			if rec.Code == http.StatusServiceUnavailable && rec.Header().Get("Retry-After") == "" {
				t.Fatalf("%s %s: 503 without Retry-After", method, path)
			}
		}
	})
}

// validMethod: a method the HTTP server passes on (an RFC 9110 token).
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// FuzzParseBatch: the one-pass decode of a batch and the item-by-item read
// agree on every body: the same problem, or the same jobs (an id the server
// made is a fresh nuid on each side, so only its presence is compared).
func FuzzParseBatch(f *testing.F) {
	for _, s := range []string{
		`[{"payload":{"a":1}}]`, `[{"idempotency_key":"k","payload":1},{"idempotency_key":"k","payload":2}]`,
		`[]`, `null`, `[null]`, `{}`, `[1]`, `[{"payload":1}] x`, `[{"payload":1}]   `, `[{"payload":1}`,
		`[{"payload":1,"nope":2}]`, `[{"payload":1,"IDEMPOTENCY_KEY":"K"}]`, `[{"payload_base64":"aGk=","content_type":"text/plain"}]`,
		`[{"payload":1,"payload_base64":"aGk="}]`, `[{"idempotency_key":7,"payload":1}]`, `[{"payload":null}]`,
		`[{"payload":1},{"payload":2},{"payload":3},{"payload":4}]`, `[{"throttle_key":"a b","payload":1}]`,
		`[{"payload":"` + strings.Repeat("x", 70) + `"}]`, `[{"content_type":"a\u0001","payload":1}]`,
		` [ {"payload" : [1,-0.5e+3,"a\"\u00e9",{"b":[true,false,null]},{}] , "idempotency_key":"a"} ] `,
		`[{"payload":01}]`, `[{"payload":1.}]`, `[{"payload":"\x"}]`, `[{"payload":1,"payload":2}]`,
		`[{"idempotency_key":"a\u0062","payload":1}]`, `[{"payload":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}]`,
		`[{"payload":{"a":1,}}]`, `[{"payload":1},]`, `[{}]`, "[{\"payload\":\"\xff\"}]",
	} {
		f.Add([]byte(s))
	}
	const maxBody, maxItems = 64, 3
	f.Fuzz(func(t *testing.T, body []byte) {
		// What scanBatch takes, encoding/json takes into the same items.
		if items, ok := scanBatch(body, nil, maxItems); ok {
			var want []api.BatchItem
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&want); err != nil || dec.More() {
				t.Fatalf("%q: scanBatch takes it, encoding/json refuses: %v", body, err)
			}
			if !reflect.DeepEqual(items, want) {
				t.Fatalf("%q: scanBatch %+v, encoding/json %+v", body, items, want)
			}
		}
		fast, fp := parseBatch(body, "demo", maxBody, maxItems)
		slow, sp := parseBatchItems(body, "demo", maxBody, maxItems)
		if (fp == nil) != (sp == nil) || fp != nil && *fp != *sp {
			t.Fatalf("%q: problems differ:\n one pass:     %+v\n item by item: %+v", body, fp, sp)
		}
		if len(fast) != len(slow) {
			t.Fatalf("%q: %d jobs in one pass, %d item by item", body, len(fast), len(slow))
		}
		for i := range fast {
			a, b := fast[i], slow[i]
			if a.job.ID != b.job.ID && (len(a.job.ID) != 22 || len(b.job.ID) != 22) {
				t.Fatalf("%q: job %d: id %q against %q", body, i, a.job.ID, b.job.ID)
			}
			a.job.ID, b.job.ID = "", ""
			aj, _ := json.Marshal(a.job)
			bj, _ := json.Marshal(b.job)
			if a.first != b.first || !bytes.Equal(aj, bj) {
				t.Fatalf("%q: job %d differs:\n one pass:     %s (first %d)\n item by item: %s (first %d)", body, i, aj, a.first, bj, b.first)
			}
		}
	})
}

// TestScanBatch: the usual forms of a batch take the fast way; an escape, a
// key spelled otherwise, a key given twice, bad JSON or a batch over the
// limit go to encoding/json.
func TestScanBatch(t *testing.T) {
	for _, tc := range []struct {
		body string
		n    int // items; -1: not taken
	}{
		{`[{"idempotency_key":"k-1","payload":{"event":"x","amount":4200,"ok":1}}]`, 1},
		{"\n[ {\"payload\":[1,-0.5e+3,\"a\\\"\\u00e9\",{\"b\":[true,false,null]},{}]},\t{\"payload_base64\":\"aGk=\",\"content_type\":\"text/plain\",\"throttle_key\":\"t\"} ]\r\n", 2},
		{`[{"payload":null},{},{"payload":"é"}]`, 3},
		{`[{"payload":1},{"payload":2},{"payload":3},{"payload":4}]`, -1}, // over maxItems
		{`[]`, -1},
		{`[{"idempotency_key":"a\u0062","payload":1}]`, -1},
		{`[{"IDEMPOTENCY_KEY":"a","payload":1}]`, -1},
		{`[{"payload":1,"payload":2}]`, -1},
		{`[{"idempotency_key":7,"payload":1}]`, -1},
		{`[{"payload":01}]`, -1},
		{`[{"payload":1}] x`, -1},
		{`[{"payload":1}`, -1},
	} {
		items, ok := scanBatch([]byte(tc.body), nil, 3)
		if n := len(items); ok != (tc.n >= 0) || ok && n != tc.n {
			t.Errorf("%q: %d items, taken %v; want %d", tc.body, n, ok, tc.n)
		}
	}
}
