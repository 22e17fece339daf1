// Package records keeps a record of each job of a lane that keeps results
// (config results): its state, its attempts and the target's answer, in a
// JetStream key-value bucket per lane, THROTTLE_RECORDS_<lane>, whose TTL is
// the lane's results.keep. Every instance reads and writes the same bucket,
// so any instance answers for any job.
//
// A record changes only by compare-and-set on its revision: intake creates
// it (create-if-absent, which also makes an Idempotency-Key last as long as
// the record), the drain claims it before an attempt starts (queued →
// in_flight) and settles it after, and a cancel moves it from queued to
// cancelled. The claim and the cancel are one compare-and-set on the same
// revision: one of them fails, so a job is never both cancelled and
// delivered.
//
// A Store is safe for concurrent use; New starts nothing.
package records

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
)

// Errors of a Store.
var (
	// ErrNotFound: no record of the job (never stored, not kept by this
	// lane, or older than keep).
	ErrNotFound = api.ErrJobNotFound
	// ErrExists: a record of the job exists already (Create).
	ErrExists = errors.New("records: the job has a record already")
	// ErrStarted: the job started or settled; it can no longer be
	// cancelled.
	ErrStarted = api.ErrJobStarted
	// ErrNotStartable: the job was cancelled or expired: it must never be
	// delivered.
	ErrNotStartable = errors.New("records: the job was cancelled or expired")
	// ErrUnavailable: JetStream did not answer; the state is unknown.
	ErrUnavailable = errors.New("records: JetStream unavailable")
	// ErrOtherOwner: the job's id has a record that another caller owns
	// (an id named by a caller who is not the job's): the job is delivered
	// without a record, and that record is left alone.
	ErrOtherOwner = errors.New("records: the job's id has another caller's record")
	// ErrNoLane: the lane keeps no records.
	ErrNoLane = errors.New("records: the lane keeps no records")
)

// BucketName is the key-value bucket of a lane's records.
func BucketName(lane string) string { return "THROTTLE_RECORDS_" + lane }

// Key is the bucket key of a job id: ids are any visible ASCII, keys a
// narrower set, so the id is base64url-encoded.
func Key(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// Store reads and writes the lanes' records.
type Store struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger

	mu    sync.RWMutex
	lanes map[string]jetstream.KeyValue
	// callbackLane is each lane's results.callback_lane.
	callbackLane map[string]string
	// replies are each lane's reply subjects (LaneSpec.Replies).
	replies map[string]*Replies
	// callbackURLs are each lane's results.callback_urls
	// (LaneSpec.CallbackURLs).
	callbackURLs map[string]*dest.Prefixes
	callbacks    Callbacks
}

// Callbacks stores the callback of a settled record as a job of the
// callback lane (queue.Queue.SendCallback).
type Callbacks interface {
	SendCallback(ctx context.Context, callbackLane string, rec api.JobRecord) error
}

// SetCallbacks makes the store send the record of every settled job that
// names a callback (delivered, dead, cancelled, expired) through c, on
// its lane's callback lane (LaneSpec.CallbackLane). Call it before the
// store is used.
func (s *Store) SetCallbacks(c Callbacks) { s.callbacks = c }

// settled tells who listens that rec is settled, right after the write
// that settled it, whichever instance made it: the record is published
// (core NATS, fire and forget) on the lane's results subject and on the
// job's reply subject when it names one the lane allows, and its callback
// is stored when it names one. A failure is logged; the record stands.
func (s *Store) settled(ctx context.Context, rec api.JobRecord) { s.settledAs(ctx, rec, nil) }

// settledAs is settled with rec encoded already as b (nil: not yet).
func (s *Store) settledAs(ctx context.Context, rec api.JobRecord, b []byte) {
	if !rec.State.Settled() {
		return
	}
	s.publish(rec, b)
	if rec.Callback == "" || s.callbacks == nil {
		return
	}
	s.mu.RLock()
	lane, urls := s.callbackLane[rec.Lane], s.callbackURLs[rec.Lane]
	s.mu.RUnlock()
	if lane == "" {
		s.log.Warn("a job names a callback but its lane has no results.callback_lane; not sent", "lane", rec.Lane, "id", rec.ID)
		return
	}
	// Checked at intake, and again here against the lane's list as it
	// is now: a job stored before a prefix was removed (a replayed dead
	// letter, a long backlog) must not be sent there.
	if _, err := urls.CheckCallback(rec.Callback); err != nil {
		s.log.Warn("a job's callback is not under its lane's results.callback_urls now; not sent", "lane", rec.Lane, "id", rec.ID, "err", err)
		return
	}
	if err := s.callbacks.SendCallback(ctx, lane, rec); err != nil {
		s.log.Warn("storing a job's callback failed; not sent", "lane", rec.Lane, "id", rec.ID, "callback_lane", lane, "err", err)
	}
}

// Headers of a published record, so a listener can route it unread.
const (
	HeaderJobID = "Throttle-Job-Id"
	HeaderLane  = "Throttle-Lane"
	HeaderState = "Throttle-State"
)

// publish sends settled rec on its reply subject, when it names one the
// lane allows, then on its results subject: a listener that heard the
// result has heard the reply too (one connection keeps its order). Core
// NATS buffers the message and returns: nothing waits for a listener. b
// is rec encoded, or nil to encode it here.
func (s *Store) publish(rec api.JobRecord, b []byte) {
	if b == nil {
		var err error
		if b, err = encode(rec); err != nil {
			s.log.Warn("encoding a settled record failed; not published", "lane", rec.Lane, "id", rec.ID, "err", err)
			return
		}
	}
	h := nats.Header{HeaderJobID: {rec.ID}, HeaderLane: {rec.Lane}, HeaderState: {string(rec.State)}}
	if rec.Reply != "" {
		s.mu.RLock()
		r := s.replies[rec.Lane]
		s.mu.RUnlock()
		if err := r.Check(rec.Reply); err != nil {
			s.log.Warn("a job's reply subject is refused; its record is not published there", "lane", rec.Lane, "id", rec.ID, "err", err)
		} else if err := s.nc.PublishMsg(&nats.Msg{Subject: rec.Reply, Header: h, Data: b}); err != nil {
			s.log.Warn("publishing a settled record on its reply subject failed", "lane", rec.Lane, "id", rec.ID, "err", err)
		}
	}
	if err := s.nc.PublishMsg(&nats.Msg{Subject: ResultsSubject(rec.Lane, rec.ID), Header: h, Data: b}); err != nil {
		s.log.Warn("publishing a settled record failed", "lane", rec.Lane, "id", rec.ID, "err", err)
	}
}

// New returns a Store on nc; it starts nothing.
func New(nc *nats.Conn, logger *slog.Logger) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("records: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{nc: nc, js: js, log: logger.With("component", "records"), lanes: map[string]jetstream.KeyValue{}, callbackLane: map[string]string{}, replies: map[string]*Replies{},
		callbackURLs: map[string]*dest.Prefixes{}}, nil
}

// LaneSpec is what the store needs of a lane.
type LaneSpec struct {
	Name string
	// Keep is how long a record lives after its last change.
	Keep time.Duration
	// MaxRecord bounds one record in bytes (the response body and the
	// rest).
	MaxRecord int32
	// Replicas for a clustered JetStream; 0 means 1.
	Replicas int
	// CallbackLane is the lane callbacks of this lane's jobs go through
	// (results.callback_lane); empty for none.
	CallbackLane string
	// CallbackURLs are the prefixes a callback must be under
	// (results.callback_urls), checked again when a record is sent; nil
	// sends none.
	CallbackURLs *dest.Prefixes
	// Replies are the subjects a settled record may be published on
	// besides its results subject (results.reply_subjects); nil for none.
	Replies *Replies
}

// EnsureLane creates or updates the bucket of a lane's records.
func (s *Store) EnsureLane(ctx context.Context, spec LaneSpec) error {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       BucketName(spec.Name),
		Description:  "job records of lane " + spec.Name,
		History:      1,
		TTL:          spec.Keep,
		MaxValueSize: spec.MaxRecord,
		Storage:      jetstream.FileStorage,
		Replicas:     max(spec.Replicas, 1),
	})
	if err != nil {
		return fmt.Errorf("%w: bucket %s: %w", ErrUnavailable, BucketName(spec.Name), err)
	}
	s.mu.Lock()
	s.lanes[spec.Name] = kv
	s.callbackLane[spec.Name] = spec.CallbackLane
	s.callbackURLs[spec.Name] = spec.CallbackURLs
	s.replies[spec.Name] = spec.Replies
	s.mu.Unlock()
	return nil
}

// Keeps reports whether lane keeps records.
func (s *Store) Keeps(lane string) bool {
	_, err := s.bucket(lane)
	return err == nil
}

func (s *Store) bucket(lane string) (jetstream.KeyValue, error) {
	s.mu.RLock()
	kv, ok := s.lanes[lane]
	s.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoLane, lane)
	}
	return kv, nil
}

// Usage says how many records a lane's bucket holds and their bytes in
// JetStream (headers and framing included).
func (s *Store) Usage(ctx context.Context, lane string) (records uint64, bytes uint64, err error) {
	kv, err := s.bucket(lane)
	if err != nil {
		return 0, 0, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: status %s: %w", ErrUnavailable, lane, err)
	}
	return st.Values(), st.Bytes(), nil
}

// Viewer is who reads or cancels records. A server without API keys has
// one principal, who sees every record (All), as does an admin key; any
// other key (Key) sees only the records it owns (api.JobRecord.Owner),
// never one without an owner (a job published over NATS). The zero Viewer
// sees nothing.
type Viewer struct {
	All bool
	Key string
}

// Everyone sees every record: the one principal of a server without keys.
var Everyone = Viewer{All: true}

// Sees reports whether v may see rec.
func (v Viewer) Sees(rec api.JobRecord) bool { return v.All || v.Key != "" && rec.Owner == v.Key }

// maxScan bounds the records Recent reads for one answer.
const maxScan = 2000

// Recent lists a lane's most recently changed records that v sees, newest
// first: at most limit, of state when it is not empty, among the last
// maxScan changes. It reads the bucket's stream backwards by sequence (a
// record's older revisions are gone: History is 1) and stops at limit
// matches. The records v does not see are passed over within the same
// scan, so a key gets up to limit of its own jobs when they are among the
// last maxScan changes of the lane, and one answer never reads more than
// maxScan records, however few of them are the caller's.
func (s *Store) Recent(ctx context.Context, lane string, v Viewer, state api.JobState, limit int) ([]api.JobRecord, error) {
	if _, err := s.bucket(lane); err != nil {
		return nil, err
	}
	st, err := s.js.Stream(ctx, "KV_"+BucketName(lane))
	if err != nil {
		return nil, fmt.Errorf("%w: stream of %s: %w", ErrUnavailable, lane, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: stream of %s: %w", ErrUnavailable, lane, err)
	}
	out := []api.JobRecord{}
	for seq, n := info.State.LastSeq, 0; seq >= max(info.State.FirstSeq, 1) && seq > 0 && n < maxScan && len(out) < limit; seq, n = seq-1, n+1 {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("%w: %s seq %d: %w", ErrUnavailable, lane, seq, err)
		}
		if m.Header.Get("KV-Operation") != "" {
			continue // a delete or purge marker
		}
		rec, err := decode(m.Data)
		if err != nil || (state != "" && rec.State != state) || !v.Sees(rec) {
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// Create stores a new record (create-if-absent) and returns its revision.
// When the job has a record already it returns that record and ErrExists.
func (s *Store) Create(ctx context.Context, rec api.JobRecord) (uint64, api.JobRecord, error) {
	kv, err := s.bucket(rec.Lane)
	if err != nil {
		return 0, api.JobRecord{}, err
	}
	b, err := encode(rec)
	if err != nil {
		return 0, api.JobRecord{}, err
	}
	rev, err := s.put(ctx, kv, rec.Lane, rec.ID, b, 0)
	if errors.Is(err, errWrongLast) {
		old, _, gerr := s.Get(ctx, rec.Lane, rec.ID)
		if gerr != nil {
			return 0, api.JobRecord{}, gerr
		}
		return 0, old, ErrExists
	}
	if err != nil {
		return 0, api.JobRecord{}, fmt.Errorf("%w: create %s/%s: %w", ErrUnavailable, rec.Lane, rec.ID, err)
	}
	return rev, rec, nil
}

// Undo removes a record Create made when its job could not be stored
// (nothing half-written), unless it changed since.
func (s *Store) Undo(ctx context.Context, lane, id string, rev uint64) error {
	kv, err := s.bucket(lane)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, Key(id), jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("%w: undo %s/%s: %w", ErrUnavailable, lane, id, err)
	}
	return nil
}

// Get reads a job's record and its revision.
func (s *Store) Get(ctx context.Context, lane, id string) (api.JobRecord, uint64, error) {
	kv, err := s.bucket(lane)
	if err != nil {
		return api.JobRecord{}, 0, err
	}
	e, err := kv.Get(ctx, Key(id))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return api.JobRecord{}, 0, ErrNotFound
	case err != nil:
		return api.JobRecord{}, 0, fmt.Errorf("%w: get %s/%s: %w", ErrUnavailable, lane, id, err)
	}
	rec, err := decode(e.Value())
	if err != nil {
		return api.JobRecord{}, 0, fmt.Errorf("records: %s/%s: %w", lane, id, err)
	}
	return rec, e.Revision(), nil
}

// update writes rec over revision rev; ok is false when the record changed
// since (another writer won).
func (s *Store) update(ctx context.Context, rec api.JobRecord, rev uint64) (newRev uint64, ok bool, err error) {
	b, err := encode(rec)
	if err != nil {
		return 0, false, err
	}
	return s.updateEncoded(ctx, rec, b, rev)
}

// updateEncoded is update with rec encoded already as b.
func (s *Store) updateEncoded(ctx context.Context, rec api.JobRecord, b []byte, rev uint64) (newRev uint64, ok bool, err error) {
	kv, err := s.bucket(rec.Lane)
	if err != nil {
		return 0, false, err
	}
	newRev, err = s.put(ctx, kv, rec.Lane, rec.ID, b, rev)
	if errors.Is(err, errWrongLast) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("%w: update %s/%s: %w", ErrUnavailable, rec.Lane, rec.ID, err)
	}
	return newRev, true, nil
}

// isWrongLast reports JetStream's refusal of a compare-and-set.
func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// maxTries bounds the compare-and-set loops; each failed try means another
// writer changed the record in between.
const maxTries = 8

// change applies fn to the job's record by compare-and-set until it holds,
// reading the record again after a lost race. fn returns an error to stop
// (nothing is written). A missing record is passed as the zero record with
// found false; fn may create it.
func (s *Store) change(ctx context.Context, lane, id string, fn func(rec *api.JobRecord, found bool) error) (api.JobRecord, uint64, error) {
	for range maxTries {
		rec, rev, err := s.Get(ctx, lane, id)
		found := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return api.JobRecord{}, 0, err
		}
		if !found {
			rec = api.JobRecord{V: api.JobRecordVersion, ID: id, Lane: lane}
		}
		if err := fn(&rec, found); err != nil {
			return rec, rev, err
		}
		newRev, ok, err := s.update(ctx, rec, rev)
		if err != nil {
			return api.JobRecord{}, 0, err
		}
		if ok {
			return rec, newRev, nil
		}
	}
	return api.JobRecord{}, 0, fmt.Errorf("%w: %s/%s changed %d times in a row", ErrUnavailable, lane, id, maxTries)
}

// Cancel moves a job that has not started (scheduled or queued) to
// cancelled: the drain's claim then fails and the job is never delivered.
// A job that started or settled answers ErrStarted with its record; one
// without a record, or whose record v does not see, ErrNotFound (and
// nothing of it). The check of v and the cancel are one compare-and-set.
// A cancelled job answers its record again.
func (s *Store) Cancel(ctx context.Context, lane, id string, v Viewer, now time.Time) (api.JobRecord, error) {
	rec, _, err := s.change(ctx, lane, id, func(rec *api.JobRecord, found bool) error {
		switch {
		case !found, !v.Sees(*rec):
			return ErrNotFound
		case rec.State == api.StateCancelled:
			return errSame
		case rec.State != api.StateQueued && rec.State != api.StateScheduled:
			return ErrStarted
		}
		rec.State = api.StateCancelled
		rec.FinishedAt = &now
		return nil
	})
	switch {
	case err == nil:
		s.settled(ctx, rec)
	case errors.Is(err, errSame):
		err = nil
	case errors.Is(err, ErrNotFound):
		rec = api.JobRecord{}
	}
	return rec, err
}

// errSame stops a change that is already made.
var errSame = errors.New("records: no change")

// Mark records a state the scheduler decides: scheduled (a delayed job
// stored, not yet in its lane's pacing), queued (a delayed job that
// entered its lane; only from scheduled) or expired (not started before its
// expiry; never delivered). Marking expired is a compare-and-set like a
// cancel: it fails with ErrStarted once the job started, so a job is never
// both expired and delivered. reason goes into the record.
func (s *Store) Mark(ctx context.Context, lane, id string, state api.JobState, reason string, now time.Time) (api.JobRecord, error) {
	return s.mark(ctx, lane, id, state, reason, "", now)
}

// mark is Mark; reply is the job's reply subject (kept in a record that
// has none, so an expired job's record is published there).
//
// A reply the lane refuses is not kept: the drain dead-letters such a job
// when it meets it.
func (s *Store) mark(ctx context.Context, lane, id string, state api.JobState, reason, reply string, now time.Time) (api.JobRecord, error) {
	reply = s.allowedReply(lane, reply)
	if state != api.StateScheduled && state != api.StateExpired && state != api.StateQueued {
		return api.JobRecord{}, fmt.Errorf("records: Mark takes scheduled, queued or expired, not %s", state)
	}
	rec, _, err := s.change(ctx, lane, id, func(rec *api.JobRecord, found bool) error {
		if found && rec.State == state {
			return errSame
		}
		if found && rec.State != api.StateQueued && rec.State != api.StateScheduled {
			return ErrStarted
		}
		if state == api.StateQueued && (!found || rec.State != api.StateScheduled) {
			return errSame
		}
		if !found {
			rec.StoredAt = &now
		}
		rec.State, rec.Reason = state, reason
		if rec.Reply == "" {
			rec.Reply = reply
		}
		if state == api.StateExpired {
			rec.FinishedAt = &now
		}
		return nil
	})
	if err == nil {
		s.settled(ctx, rec)
	}
	if errors.Is(err, errSame) {
		err = nil
	}
	return rec, err
}

// Replay is a dead letter being replayed (queue.Queue.ReplayDead).
type Replay struct {
	// Key is the key the job is stored with (its dead letter's, or the
	// one the replay gives it).
	Lane, ID, Key string
	// Callback is the job's callback URL, kept with its dead letter.
	Callback string
	// Owner is the API key that submitted the job (api.JobRecord.Owner),
	// kept with its dead letter: the owner of a new record.
	Owner string
	// Seq is the dead letter's sequence (api.JobRecord.ReplayedFrom).
	Seq uint64
}

// Replaying puts the record of a job replayed from the dead letters back
// to queued before the job is stored again: its claim must not meet a
// settled cancelled or expired record (it would drop the job), GET must
// not answer the old end, and the replay's settled record is a callback of
// its own (Replays counts up; ReplayedFrom, the dead letter's sequence,
// names it). The attempts stay; the end (finished_at,
// reason, response) goes; the reply subject is the one the claim checks
// again, and the key is the one the job is stored with (a replay may give
// it another). A job whose record is gone (older than keep) gets a new one. A
// cancelled job stays cancelled: a cancel is never undone, and the drain
// drops the replayed copy as it drops any cancelled job. A record of
// another owner (the dead job's own outlived results.keep and another
// caller chose its id since) is not the job's: it stays as it is, and the
// replayed job's claim (ErrOtherOwner) delivers it without a record. undo
// puts the record back as it was, for a replay whose store failed.
func (s *Store) Replaying(ctx context.Context, r Replay, now time.Time) (undo func(), err error) {
	var old api.JobRecord
	var existed bool
	rec, rev, err := s.change(ctx, r.Lane, r.ID, func(rec *api.JobRecord, found bool) error {
		old, existed = *rec, found
		if found && (rec.State == api.StateCancelled || rec.Owner != r.Owner) {
			return errSame
		}
		if !found {
			rec.StoredAt, rec.Attempts, rec.Owner = &now, []api.JobAttempt{}, r.Owner
		}
		// The key the job is stored with now (a replay may give it one:
		// queue.ReplayOptions.Key), which the claim keeps.
		rec.Key = r.Key
		if r.Callback != "" {
			rec.Callback = r.Callback
		}
		rec.State, rec.Replays, rec.ReplayedFrom = api.StateQueued, rec.Replays+1, r.Seq
		rec.FinishedAt, rec.Reason, rec.Response, rec.Reply = nil, "", nil, ""
		return nil
	})
	if errors.Is(err, errSame) {
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		var err error
		if existed {
			_, _, err = s.update(uctx, old, rev)
		} else {
			err = s.Undo(uctx, rec.Lane, rec.ID, rev)
		}
		if err != nil {
			s.log.Warn("putting back the record of a job whose replay failed", "lane", rec.Lane, "id", rec.ID, "err", err)
		}
	}, nil
}

// undoTimeout bounds the write that puts a record back.
const undoTimeout = 2 * time.Second

// Claim is a job's record held by the attempt that claimed it.
type Claim struct {
	Record api.JobRecord
	Rev    uint64
}

// Attempt is the attempt Start claims a record for.
type Attempt struct {
	Lane, ID, Key string
	// Hint is the revision intake created the record at (0: unknown):
	// with it the common case is one write, no read.
	Hint uint64
	// Fresh: no record is expected (a job stored without one, before its
	// first attempt): the claim tries to create it first, one write.
	Fresh bool
	// Stored is the job's first store time, for a record intake did not
	// write; Now the attempt's start.
	Stored, Now time.Time
	// Callback is the job's callback URL (queue.Job.Callback), kept in
	// its record.
	Callback string
	// Reply is the job's reply subject (queue.Job.Reply), checked by the
	// lane (Replies.Check), kept in its record.
	Reply string
	// Owner is the API key that submitted the job (queue.Job.Owner, read
	// only from what the throttler stored): the owner of a record the
	// claim creates. A record that exists keeps its own.
	Owner string
	// ReplayedFrom is the dead letter a replayed job came from
	// (queue.Job.ReplayedFrom), kept in a record the claim creates: a
	// replayed job whose record expired before its claim still names
	// its replay's callback. A record that exists keeps its own.
	ReplayedFrom uint64
}

// Start claims a job's record for an attempt: queued, scheduled or
// retrying (or in_flight again after a crash, or settled again for a
// delivery JetStream makes once more) become in_flight, and a job without a
// record gets one. A cancelled or expired job answers ErrNotStartable: it
// must not be delivered.
func (s *Store) Start(ctx context.Context, a Attempt) (Claim, error) {
	if a.Hint != 0 || a.Fresh {
		rec := api.JobRecord{V: api.JobRecordVersion, ID: a.ID, Lane: a.Lane, Key: a.Key, State: api.StateInFlight,
			StoredAt: &a.Stored, StartedAt: &a.Now, Attempts: []api.JobAttempt{}, Callback: a.Callback, Reply: a.Reply, Owner: a.Owner,
			ReplayedFrom: a.ReplayedFrom}
		if rev, ok, err := s.update(ctx, rec, a.Hint); err != nil {
			return Claim{}, err
		} else if ok {
			return Claim{Record: rec, Rev: rev}, nil
		}
	}
	rec, rev, err := s.change(ctx, a.Lane, a.ID, func(rec *api.JobRecord, found bool) error {
		if found && rec.Owner != a.Owner {
			// Not this job's record: another caller named the job's id
			// (a job published over NATS is found by its Nats-Msg-Id
			// while it waits). Neither its state (a cancel of it) nor
			// this job's answer crosses over.
			return ErrOtherOwner
		}
		if rec.Reply == "" {
			// Before the check: a job cancelled before any instance
			// claimed it (CancelStored) has its record published on
			// its reply subject when the drain meets it.
			rec.Reply = a.Reply
		}
		if rec.State == api.StateCancelled || rec.State == api.StateExpired {
			return ErrNotStartable
		}
		if !found {
			rec.Key, rec.StoredAt, rec.Owner, rec.ReplayedFrom = a.Key, &a.Stored, a.Owner, a.ReplayedFrom
		}
		if rec.Callback == "" {
			rec.Callback = a.Callback
		}
		if rec.StartedAt == nil {
			rec.StartedAt = &a.Now
		}
		if rec.Attempts == nil {
			rec.Attempts = []api.JobAttempt{}
		}
		rec.State, rec.FinishedAt, rec.Response, rec.Reason = api.StateInFlight, nil, nil, ""
		return nil
	})
	if errors.Is(err, ErrNotStartable) {
		// The drain meets a cancelled or expired job: its callback is
		// stored again, in case the instance that settled it stopped
		// before it could (the callback lane's stream drops the repeat
		// within its dedup window; after it, the receiver gets the same
		// record again under the same Idempotency-Key).
		s.settled(ctx, rec)
	}
	if err != nil {
		return Claim{}, err
	}
	return Claim{Record: rec, Rev: rev}, nil
}

// Waiting is a job that waits in its lane's stream without a record: one
// stored with a SeqID id, or one published over NATS.
type Waiting struct {
	Lane, ID, Key string
	// Reply is the Throttle-Reply the job names, if any: kept in its
	// record when the lane allows it (Replies.Check).
	Reply string
	// Owner is the API key that submitted the job (queue.Job.Owner);
	// empty for a job published over NATS.
	Owner string
	// Stored is when the job was stored.
	Stored time.Time
}

// Queued is the record a waiting job has until the drain claims it:
// queued, with what its claim would keep (its owner, and its reply
// subject when the lane allows it).
func (s *Store) Queued(w Waiting) api.JobRecord {
	return api.JobRecord{V: api.JobRecordVersion, ID: w.ID, Lane: w.Lane, Key: w.Key, State: api.StateQueued,
		StoredAt: &w.Stored, Attempts: []api.JobAttempt{}, Reply: s.allowedReply(w.Lane, w.Reply), Owner: w.Owner}
}

// allowedReply is reply when lane allows it (Replies.Check), else "".
func (s *Store) allowedReply(lane, reply string) string {
	if reply == "" {
		return ""
	}
	s.mu.RLock()
	r := s.replies[lane]
	s.mu.RUnlock()
	if r.Check(reply) != nil {
		return ""
	}
	return reply
}

// CancelStored cancels a job that waits in its lane's stream without a
// record: it creates the record as cancelled (create-if-absent), which the
// drain's claim (a create as well, or a compare-and-set after a read) then
// finds, so exactly one of the two wins. The record is then published like
// any settled one. When the job has a record by now, it is Cancel. A job
// v does not see is ErrNotFound, untouched.
func (s *Store) CancelStored(ctx context.Context, w Waiting, v Viewer, now time.Time) (api.JobRecord, error) {
	rec := s.Queued(w)
	if !v.Sees(rec) {
		return api.JobRecord{}, ErrNotFound
	}
	rec.State, rec.FinishedAt = api.StateCancelled, &now
	if _, ok, err := s.update(ctx, rec, 0); err != nil {
		return api.JobRecord{}, err
	} else if ok {
		s.settled(ctx, rec)
		return rec, nil
	}
	return s.Cancel(ctx, w.Lane, w.ID, v, now)
}

// Finish writes the end of an attempt: fn sets the state (retrying,
// delivered, dead, or queued again for a job handed back unstarted) and
// appends the attempt. The claim's revision is tried first; after a lost
// race (a duplicate delivery) the record is read again.
func (s *Store) Finish(ctx context.Context, c Claim, fn func(rec *api.JobRecord)) (api.JobRecord, error) {
	rec := c.Record
	fn(&rec)
	keepLastAttempts(&rec)
	// Encoded once: what is stored is what is published.
	b, err := encode(rec)
	if err != nil {
		return api.JobRecord{}, err
	}
	if _, ok, err := s.updateEncoded(ctx, rec, b, c.Rev); err != nil {
		return api.JobRecord{}, err
	} else if ok {
		s.settledAs(ctx, rec, b)
		return rec, nil
	}
	rec, _, err = s.change(ctx, c.Record.Lane, c.Record.ID, func(r *api.JobRecord, _ bool) error {
		fn(r)
		keepLastAttempts(r)
		return nil
	})
	if err == nil {
		s.settled(ctx, rec)
	}
	return rec, err
}

// MaxAttempts bounds the attempts a record keeps: the last ones. A job
// whose target answers 429 adds one per answer without counting against
// retry.max_attempts, and a record that outgrew its bucket's value size
// (results: twice max_body and 64KiB) could no longer be written: it
// stayed as it was, in_flight or retrying, after the job settled.
const MaxAttempts = 100

// keepLastAttempts drops the oldest of rec's attempts past MaxAttempts.
func keepLastAttempts(rec *api.JobRecord) {
	if n := len(rec.Attempts); n > MaxAttempts {
		rec.Attempts = rec.Attempts[n-MaxAttempts:]
	}
}

// maxRecordSize bounds a record read back: the largest results.max_body,
// base64-encoded, and room for the rest.
const maxRecordSize = 2 << 20

// Decode reads a record in the wire format (a record published to a
// waiting instance, or read from the bucket).
func Decode(b []byte) (api.JobRecord, error) { return decode(b) }

func decode(b []byte) (api.JobRecord, error) {
	if len(b) > maxRecordSize {
		return api.JobRecord{}, fmt.Errorf("record of %d bytes is over %d", len(b), maxRecordSize)
	}
	var rec api.JobRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return api.JobRecord{}, fmt.Errorf("record: %w", err)
	}
	if rec.V != api.JobRecordVersion {
		return api.JobRecord{}, fmt.Errorf("record version %d, want %d", rec.V, api.JobRecordVersion)
	}
	return rec, nil
}
