package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
)

// CallbackSuffix ends the id of a job's callback: "<lane>.<id>.callback",
// or "<lane>.<id>.callback-<n>" for the record of its n-th replay from the
// dead letters. The id is the callback's Idempotency-Key, so a second send
// of the same settled record (a crash between the record's write and the
// send, two instances settling one job) is de-duplicated by its lane's
// stream, and a replay's record, a new one, is not.
const CallbackSuffix = ".callback"

// CallbackID is the id of the callback of the job id of lane, after
// replays replays. Two different (id, replays) never share an id: a job
// id ends the first form with ".callback", the other with digits.
func CallbackID(lane, id string, replays int) string {
	return lane + "." + id + callbackEnd(replays)
}

func callbackEnd(replays int) string {
	if replays <= 0 {
		return CallbackSuffix
	}
	return CallbackSuffix + "-" + strconv.Itoa(replays)
}

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
	id := CallbackID(rec.Lane, rec.ID, rec.Replays)
	if len(id) > MaxJobID {
		// The job's own id fills the bound: its digest stands for it.
		sum := sha256.Sum256([]byte(rec.Lane + "\x00" + rec.ID))
		id = "cb." + hex.EncodeToString(sum[:]) + callbackEnd(rec.Replays)
	}
	_, err = q.Publish(ctx, Job{ID: id, Lane: callbackLane, ContentType: "application/json", Payload: body,
		Dest: dest.Request{URL: rec.Callback}})
	if err != nil {
		return fmt.Errorf("queue: callback of %s/%s on lane %s: %w", rec.Lane, rec.ID, callbackLane, err)
	}
	return nil
}
