package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/throttler/throttler/api"
)

// Get reads a job's record (GET /v1/lanes/{lane}/jobs/{id}) on a lane that
// keeps results: its state, attempts and, once settled, the target's
// answer. An unknown id is an *Error with StatusCode 404 (ErrNotFound).
func (c *Client) Get(ctx context.Context, lane, id string) (*api.JobRecord, error) {
	return c.getJob(ctx, lane, id, nil)
}

// maxWaitPerCall is the wait asked of the server in one call of Wait: a
// lane's results.max_wait is at least this by default (60 s).
const maxWaitPerCall = 20 * time.Second

// Wait waits until a job settles (delivered, dead, cancelled, expired) and
// returns its record, asking the server to hold each call up to 20 s (under the CLI's and most clients' 30-s request timeout)
// (GET …?wait=), until ctx ends; then it returns the last record read and
// ctx's error.
func (c *Client) Wait(ctx context.Context, lane, id string) (*api.JobRecord, error) {
	for {
		wait := maxWaitPerCall
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if wait <= 0 {
			return nil, context.DeadlineExceeded
		}
		rec, err := c.getJob(ctx, lane, id, url.Values{"wait": {wait.Round(time.Millisecond).String()}})
		if err != nil {
			return rec, err
		}
		if rec.State.Settled() {
			return rec, nil
		}
		if err := ctx.Err(); err != nil {
			return rec, err
		}
	}
}

func (c *Client) getJob(ctx context.Context, lane, id string, q url.Values) (*api.JobRecord, error) {
	var out api.JobRecord
	if _, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "lanes", lane, "jobs", id}, query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Cancel cancels a job that has not started (DELETE
// /v1/lanes/{lane}/jobs/{id}): its record, state cancelled; it is never
// delivered. A job that started or settled is an *Error with StatusCode 409.
func (c *Client) Cancel(ctx context.Context, lane, id string) (*api.JobRecord, error) {
	var out api.JobRecord
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: []string{"v1", "lanes", lane, "jobs", id}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
