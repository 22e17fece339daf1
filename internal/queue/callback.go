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
// or "<lane>.<id>.callback-<n>" for the record of a replay from the dead
// letters, n being the sequence of the dead letter it was replayed from
// (api.JobRecord.ReplayedFrom). The id is the callback's Idempotency-Key,
// so a second send of the same settled record (a crash between the
// record's write and the send, two instances settling one job, the drain
// meeting a cancelled job) is de-duplicated by its lane's stream, and a
// replay's record, a new one, is not. A dead letter's sequence is never
// used twice, and the replayed job carries it to its claim (which makes
// the record again when it is gone), so a replay's id stays its own when
// the record expires between two replays or before the replayed job's
// claim.
const CallbackSuffix = ".callback"

// CallbackID is the id of the callback of settled record rec. Two
// different (lane, id, replay) never share one: a job id ends the first
// form with ".callback", the other with digits. A record written before
// ReplayedFrom was kept names its replay by its Replays count, as it did
// then. A lane and job id that leave no room within MaxJobID are stood
// for by their digest: "cb.<sha-256 hex>.callback[-<n>]".
func CallbackID(rec api.JobRecord) string {
	end := CallbackSuffix
	if n := rec.ReplayedFrom; n != 0 {
		end += "-" + strconv.FormatUint(n, 10)
	} else if rec.Replays > 0 {
		end += "-" + strconv.Itoa(rec.Replays)
	}
	if id := rec.Lane + "." + rec.ID + end; len(id) <= MaxJobID {
		return id
	}
	sum := sha256.Sum256([]byte(rec.Lane + "\x00" + rec.ID))
	return "cb." + hex.EncodeToString(sum[:]) + end
}

// SendCallback stores the callback of settled record rec as a job of
// callbackLane: its payload is the record's JSON, its URL the record's
// Callback (checked at intake against the job's lane's
// results.callback_urls, and again by the callback lane's HTTP target
// against its job_urls), its id CallbackID. The callback lane paces,
// signs, retries and dead-letters it like any job.
func (q *Queue) SendCallback(ctx context.Context, callbackLane string, rec api.JobRecord) error {
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("queue: callback of %s/%s: %w", rec.Lane, rec.ID, err)
	}
	_, err = q.Publish(ctx, Job{ID: CallbackID(rec), Lane: callbackLane, ContentType: "application/json", Payload: body,
		Dest: dest.Request{URL: rec.Callback}})
	if err != nil {
		return fmt.Errorf("queue: callback of %s/%s on lane %s: %w", rec.Lane, rec.ID, callbackLane, err)
	}
	return nil
}
