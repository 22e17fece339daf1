package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
)

// CallbackSuffix ends the id of a job's callback: "<lane>.<id>.callback".
// The id is the callback's Idempotency-Key, so a second send of the same
// settled record (a crash between the record's write and the send, two
// instances settling one job) is de-duplicated by its lane's stream.
const CallbackSuffix = ".callback"

// CallbackID is the id of the callback job of job id of lane.
func CallbackID(lane, id string) string { return lane + "." + id + CallbackSuffix }

// SendCallback stores the callback of settled record rec as a job of
// callbackLane: its payload is the record's JSON, its URL the record's
// Callback (checked at intake against the job's lane's
// results.callback_urls, and again by the callback lane's HTTP target
// against its job_urls). The callback lane paces, signs, retries and
// dead-letters it like any job.
func (q *Queue) SendCallback(ctx context.Context, callbackLane string, rec api.JobRecord) error {
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("queue: callback of %s/%s: %w", rec.Lane, rec.ID, err)
	}
	id := CallbackID(rec.Lane, rec.ID)
	if len(id) > MaxJobID {
		// The job's own id fills the bound: its digest stands for it.
		sum := sha256.Sum256([]byte(rec.Lane + "\x00" + rec.ID))
		id = "cb." + hex.EncodeToString(sum[:]) + CallbackSuffix
	}
	_, err = q.Publish(ctx, Job{ID: id, Lane: callbackLane, ContentType: "application/json", Payload: body,
		Dest: dest.Request{URL: rec.Callback}})
	if err != nil {
		return fmt.Errorf("queue: callback of %s/%s on lane %s: %w", rec.Lane, rec.ID, callbackLane, err)
	}
	return nil
}
