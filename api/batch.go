package api

import "encoding/json"

// BatchItem is one job of a POST /v1/lanes/{lane}/jobs:batch body (a JSON
// array of them). Exactly one of Payload and PayloadBase64 is given.
type BatchItem struct {
	// IdempotencyKey is the job id, as the Idempotency-Key header of a
	// single submission; empty: the server makes one.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Payload is any JSON value, stored as written (media type
	// application/json unless ContentType says otherwise).
	Payload json.RawMessage `json:"payload,omitempty"`
	// PayloadBase64 is a payload that is not JSON, base64 (RFC 4648,
	// standard alphabet, padded); its media type is ContentType, else
	// application/octet-stream.
	PayloadBase64 string `json:"payload_base64,omitempty"`
	// ContentType is the payload's media type, as the Content-Type header
	// of a single submission.
	ContentType string `json:"content_type,omitempty"`
	// ThrottleKey is the job's key on a keyed lane, as the Throttle-Key
	// header of a single submission.
	ThrottleKey string `json:"throttle_key,omitempty"`
	// Trace is the job's W3C trace context, as the traceparent,
	// tracestate and baggage headers of a single submission; an item
	// without one takes the batch request's headers.
	Trace *Trace `json:"trace,omitempty"`
	// Delay, NotBefore and Expires are the job's schedule, as the
	// Throttle-Delay, Throttle-Not-Before and Throttle-Expires headers of
	// a single submission.
	Delay     string `json:"delay,omitempty"`
	NotBefore string `json:"not_before,omitempty"`
	Expires   string `json:"expires,omitempty"`
	// Method, Path and URL say where the job goes within its HTTP lane's
	// target, as the Throttle-Method, Throttle-Path and Throttle-URL
	// headers of a single submission; Headers are the headers it
	// forwards, as its Throttle-Forward-<Name> headers (name: value).
	Method  string            `json:"method,omitempty"`
	Path    string            `json:"path,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// Callback is where the job's settled record is POSTed, as the
	// Throttle-Callback header of a single submission.
	Callback string `json:"callback,omitempty"`
}

// Trace is a job's W3C trace context (https://www.w3.org/TR/trace-context/,
// https://www.w3.org/TR/baggage/), each field the value of the header of
// the same name.
type Trace struct {
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	Baggage     string `json:"baggage,omitempty"`
}

// BatchResult is the outcome of one job of a batch: Status 202 and the
// fields of Accepted when it was stored (or is a duplicate), else the
// status and Problem that refused it. Nothing of a refused job was stored.
type BatchResult struct {
	Status    int      `json:"status"`
	ID        string   `json:"id"`
	State     JobState `json:"state,omitempty"`
	ETAMillis int64    `json:"eta_ms"`
	Duplicate bool     `json:"duplicate,omitempty"`
	// Problem says why the job was refused; nil when it was stored.
	Problem *Problem `json:"problem,omitempty"`
}

// BatchAccepted is the body of a batch answer: one result per submitted
// job, in the order of the request.
type BatchAccepted struct {
	Lane string `json:"lane"`
	// Accepted counts the jobs stored or found stored (duplicates);
	// Failed the ones refused.
	Accepted int           `json:"accepted"`
	Failed   int           `json:"failed"`
	Results  []BatchResult `json:"results"`
}
