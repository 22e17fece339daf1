package api

import "time"

// Job states of a record (GET /v1/lanes/{lane}/jobs/{id}). StateQueued and
// StateScheduled are shared with the Accepted answer.
const (
	// StateInFlight: an attempt is running.
	StateInFlight JobState = "in_flight"
	// StateRetrying: an attempt failed; the job waits for its next one.
	StateRetrying JobState = "retrying"
	// StateDelivered: the target accepted the job (settled).
	StateDelivered JobState = "delivered"
	// StateDead: the job went to the dead letters (settled).
	StateDead JobState = "dead"
	// StateCancelled: the job was cancelled before it started; it is never
	// delivered (settled).
	StateCancelled JobState = "cancelled"
	// StateExpired: the job was not started before its expiry; it is never
	// delivered (settled).
	StateExpired JobState = "expired"
)

// Settled reports a final state: the record changes no more.
func (s JobState) Settled() bool {
	switch s {
	case StateDelivered, StateDead, StateCancelled, StateExpired:
		return true
	}
	return false
}

// JobRecordVersion is the version of the JobRecord wire format (field V).
const JobRecordVersion = 1

// JobRecord is what the throttler knows of one job of a lane that keeps
// results: GET /v1/lanes/{lane}/jobs/{id}, the record a waited submission
// reads its answer from.
type JobRecord struct {
	V     int      `json:"v"`
	ID    string   `json:"id"`
	Lane  string   `json:"lane"`
	Key   string   `json:"key,omitempty"`
	State JobState `json:"state"`
	// StoredAt is when the job was first stored; StartedAt when its first
	// attempt started; FinishedAt when it settled.
	StoredAt   *time.Time `json:"stored_at,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Attempts are the delivery attempts, oldest first: the last 100
	// (a target answering 429 adds one per answer).
	Attempts []JobAttempt `json:"attempts"`
	// Reason says why a job is dead or expired.
	Reason string `json:"reason,omitempty"`
	// Response is the target's answer to the last attempt of a settled
	// job (delivered, or dead after an answer).
	Response *JobResponse `json:"response,omitempty"`
	// Callback is the URL the settled record is POSTed to
	// (Throttle-Callback); empty for none.
	Callback string `json:"callback,omitempty"`
	// Reply is the NATS subject the settled record is published to
	// (Throttle-Reply on a job published over NATS); empty for none.
	Reply string `json:"reply,omitempty"`
	// Replays counts the times the job was replayed from the dead
	// letters while this record was kept; 0 for none. It starts again
	// when the record expires between two replays.
	Replays int `json:"replays,omitempty"`
	// ReplayedFrom is the sequence of the dead letter the job was last
	// replayed from (GET /v1/lanes/{lane}/dead/{seq}); 0 for a job never
	// replayed. It names the replay's callback (a new Idempotency-Key,
	// <lane>.<id>.callback-<seq>): a sequence of the dead letters is
	// never used twice, so it outlives the record, as Replays does not.
	ReplayedFrom uint64 `json:"replayed_from,omitempty"`
	// Owner is the id of the API key that submitted the job over HTTP
	// when the server takes API keys (auth.keys); empty for a job
	// published over NATS and for every job of a server without keys.
	// With keys, a key sees (GET, DELETE, the list) only the jobs it
	// owns; an admin key sees every job, and only it sees a job without
	// an owner.
	Owner string `json:"owner,omitempty"`
}

// JobAttempt is one delivery attempt of a job.
type JobAttempt struct {
	At time.Time `json:"at"`
	// Status is the target's HTTP status; 0 when there was no answer.
	Status int `json:"status,omitempty"`
	// Error classifies an attempt without an answer: timeout, connection,
	// forbidden_address, redirected, or error.
	Error string `json:"error,omitempty"`
	// DurationMillis is how long the attempt took.
	DurationMillis float64 `json:"duration_ms"`
}

// JobResponse is the target's answer kept in a record.
type JobResponse struct {
	Status int `json:"status"`
	// Headers are the answer's headers the lane lists (results.headers),
	// and Content-Type.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the answer's body when it is valid UTF-8 that JSON escapes
	// to at most twice its length, else BodyBase64 holds it (standard
	// base64); at most the lane's results.max_body.
	Body       string `json:"body,omitempty"`
	BodyBase64 string `json:"body_base64,omitempty"`
	// Truncated: the body was longer than results.max_body and was cut.
	Truncated bool `json:"truncated,omitempty"`
}

// JobList is GET /v1/lanes/{lane}/jobs: a lane's most recently changed
// records, newest first.
type JobList struct {
	Jobs []JobRecord `json:"jobs"`
}
