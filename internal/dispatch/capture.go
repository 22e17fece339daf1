package dispatch

import (
	"bytes"
	"io"
	"net/http"
)

// Capture says what of an HTTP target's answer a delivery keeps (a lane
// with results): up to MaxBody bytes of the body, and the listed headers
// besides Content-Type.
type Capture struct {
	MaxBody int64
	// Headers are canonical header names.
	Headers []string
}

// Response is the part of a target's answer a delivery kept (Capture).
type Response struct {
	Status int
	// Header holds Content-Type and the captured headers that were
	// present (their first values).
	Header map[string]string
	Body   []byte
	// Truncated: the body was longer than Capture.MaxBody and was cut.
	Truncated bool
}

// capture reads what c keeps of resp; the rest of the body is left to the
// caller's drain.
func (c *Capture) capture(resp *http.Response) *Response {
	r := &Response{Status: resp.StatusCode, Header: map[string]string{}}
	if v := resp.Header.Get("Content-Type"); v != "" {
		r.Header["Content-Type"] = v
	}
	for _, k := range c.Headers {
		if v := resp.Header.Get(k); v != "" {
			r.Header[k] = v
		}
	}
	if c.MaxBody > 0 {
		var buf bytes.Buffer
		n, _ := io.Copy(&buf, io.LimitReader(resp.Body, c.MaxBody+1))
		if n > c.MaxBody {
			r.Truncated = true
			buf.Truncate(int(c.MaxBody))
		}
		r.Body = buf.Bytes()
	}
	return r
}
