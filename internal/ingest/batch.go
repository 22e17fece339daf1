package ingest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nuid"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/jsonenc"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// Batch intake: POST /v1/lanes/{lane}/jobs:batch takes a JSON array of
// api.BatchItem and answers one api.BatchResult per item, in order. The
// whole body is read and every item checked before anything is stored: bad
// input (a malformed item, a batch over the limits) stores nothing and gets
// one problem naming the item's field as a JSON pointer ("/3/idempotency_key").
// Then every item goes through the same admission as a single job, and the
// admitted ones are stored with asynchronous publishes in one window; an item
// refused then (backlog full, storage full) gets its own problem and does not
// undo the others.

// Defaults of the batch limits (http.max_batch_items, http.max_batch_bytes).
const (
	DefaultMaxBatchItems = 1000
	DefaultMaxBatchBytes = 8 << 20
)

// Content types of batch items without one.
const (
	jsonContentType   = "application/json"
	binaryContentType = "application/octet-stream"
)

// batchJob is one checked item of a batch.
type batchJob struct {
	job queue.Job
	// first is the index of the item with the same id earlier in the
	// batch, or -1: a repeated id is answered as a duplicate of its first
	// item and not published again.
	first int
	// when is the item's delay, not_before and expires, read into the
	// job's NotBefore and Expires by batchSchedules.
	when queue.When
	// given: the item named its id (idempotency_key).
	given bool
}

func (h *Handler) submitBatch(w http.ResponseWriter, r *http.Request) {
	name, lane, rj, ok := h.openLane(w, r, "batch")
	if !ok {
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if why := contentTypeError(ct); why != "" {
			rj.reject(refusal(ErrBadHeader, "Content-Type", "%s", why), "invalid_content_type")
			return
		}
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != jsonContentType {
			rj.reject(&Refusal{Err: ErrBadHeader, Field: "Content-Type", Status: http.StatusUnsupportedMediaType,
				Detail: "a batch is a JSON array: send Content-Type: application/json"}, "invalid_content_type")
			return
		}
	}
	maxBytes, maxItems := h.maxBatchBytes(), h.maxBatchItems()
	tooBig := func() {
		rj.reject(refusal(ErrBodyTooLarge, "", "the batch is larger than http.max_batch_bytes (%d bytes); split it", maxBytes), "body_too_large")
	}
	body, reserved, ok := h.readBody(w, r, maxBytes, &rj, tooBig)
	if !ok {
		return
	}
	defer h.bodies.give(reserved)
	jobs, rf := parseBatch(body, name, lane.MaxBody, maxItems)
	switch {
	case rf != nil && errors.Is(rf, ErrBodyTooLarge):
		rj.reject(rf, "body_too_large")
		return
	case rf != nil:
		rj.reject(rf, "bad_body")
		return
	}
	if rf := keysOf(jobs, name, lane); rf != nil {
		switch keyFault(rf) {
		case faultMissing:
			rj.reject(rf, "missing_throttle_key")
		case faultKey:
			rj.reject(rf, "invalid_throttle_key")
		default:
			rj.reject(rf, "invalid_destination")
		}
		return
	}
	if err := batchTrace(r, jobs); err != nil {
		rj.reject(err, "invalid_trace_context")
		return
	}
	if rf := batchSchedules(jobs, lane, time.Now()); rf != nil {
		rj.reject(rf, "invalid_schedule")
		return
	}
	if rf := batchDest(jobs, lane); rf != nil {
		rj.reject(rf, "invalid_destination")
		return
	}
	if rf := batchCallbacks(jobs, lane); rf != nil {
		rj.reject(rf, "invalid_callback")
		return
	}
	if err := refuseReply(r); err != nil {
		rj.reject(err, "invalid_reply")
		return
	}
	// The batch costs its caller the lane's cost per item, before
	// anything is stored; a refusal (429, or 413 over the plan's burst) is
	// answered there.
	if !h.chargeJobs(w, r, lane, len(jobs)) {
		return
	}
	h.storeBatch(w, r, name, lane, jobs)
}

// keysOf applies a lane's keying to a checked batch: on a keyed lane every
// item needs its throttle_key (as every single job needs its Throttle-Key),
// or on a url_host lane (Lane.KeyFromURL) a url whose host is its key (a
// throttle_key without a url only as Lane.KeyWithoutURL allows); on a lane
// without keys the field is ignored, as the header is.
func keysOf(jobs []batchJob, name string, lane Lane) *Refusal {
	keyed := lane.Admission.KeyLimit != nil
	for i := range jobs {
		job := &jobs[i].job
		at := "/" + strconv.Itoa(i)
		switch {
		case !keyed:
			job.Key = ""
		case lane.KeyFromURL && job.Dest.URL != "":
			key, err := lane.Dest.KeyOf(job.Dest.URL)
			if err != nil {
				return destRefusal(err, at)
			}
			switch err := keyAgrees(job.Key, key); {
			case errors.Is(err, errKeyDisagrees):
				return &Refusal{Err: ErrBadBody, Cause: err, Field: at + "/throttle_key", Detail: fmt.Sprintf("item %d: throttle_key %v", i, err)}
			case err != nil:
				return &Refusal{Err: ErrBadBody, Cause: err, Field: at + "/url", Detail: fmt.Sprintf("item %d: url: its host cannot be a key: %v", i, err)}
			}
			job.Key = key
		case lane.KeyFromURL && job.Key != "":
			if err := keyWithoutURL(lane, job.Key); err != nil {
				return &Refusal{Err: ErrBadBody, Cause: err, Field: at + "/throttle_key", Detail: fmt.Sprintf("item %d: throttle_key %v", i, err)}
			}
		case job.Key == "" && lane.KeyFromURL:
			return &Refusal{Err: ErrBadBody, Cause: errNoKey, Field: at + "/throttle_key",
				Detail: fmt.Sprintf("item %d: lane %s is keyed with per_key.key_from %s: every item needs a throttle_key naming its key, or a url whose host is its key", i, name, dest.KeyFromURLHost)}
		case job.Key == "":
			return &Refusal{Err: ErrBadBody, Cause: errNoKey, Field: at + "/throttle_key",
				Detail: fmt.Sprintf("item %d: lane %s is keyed: every item needs a throttle_key naming its key", i, name)}
		}
	}
	return nil
}

func (h *Handler) maxBatchItems() int {
	if h.cfg.MaxBatchItems > 0 {
		return h.cfg.MaxBatchItems
	}
	return DefaultMaxBatchItems
}

func (h *Handler) maxBatchBytes() int64 {
	if h.cfg.MaxBatchBytes > 0 {
		return h.cfg.MaxBatchBytes
	}
	return DefaultMaxBatchBytes
}

// parseBatch reads and checks every item of a batch body; a refusal names
// the first thing wrong (its Field a JSON pointer), and then nothing may be
// stored. A refusal carries no cause, so that two are equal (==) when they
// say the same.
//
// A well-formed body is decoded in one pass into a pooled slice of items:
// by scanBatch when it has the usual form (exact keys, strings without
// escapes), else by decodeStrict; anything that pass refuses (bad JSON,
// an unknown, repeated or miscased field, a wrong type, a string that is
// not UTF-8, too many items, data after the array) is
// read again item by item by parseBatchItems, which names what is wrong,
// so all agree on every body (FuzzParseBatch).
func parseBatch(body []byte, lane string, maxBody int64, maxItems int) ([]batchJob, *Refusal) {
	ip := batchItems.Get().(*[]api.BatchItem)
	defer func() {
		clear(*ip)
		if cap(*ip) <= maxPooledItems {
			*ip = (*ip)[:0]
			batchItems.Put(ip)
		}
	}()
	items, ok := scanBatch(body, (*ip)[:0], maxItems)
	*ip = items
	if !ok {
		clear(items)
		items = items[:0]
		err := decodeStrict(body, &items)
		*ip = items
		if err != nil || items == nil || len(items) == 0 || len(items) > maxItems {
			return parseBatchItems(body, lane, maxBody, maxItems)
		}
	}
	jobs := make([]batchJob, len(items))
	seen := make(map[string]int, len(items))
	for i := range items {
		job, rf := checkItem(items[i], i, lane, maxBody)
		if rf != nil {
			return nil, rf
		}
		jobs[i] = batchJob{job: job, first: -1, when: itemWhen(items[i]), given: items[i].IdempotencyKey != ""}
		if f, ok := seen[job.ID]; ok {
			jobs[i].first = f
		} else {
			seen[job.ID] = i
		}
	}
	return jobs, nil
}

// batchItems holds the decode targets of parseBatch.
var batchItems = sync.Pool{New: func() any { return new([]api.BatchItem) }}

// maxPooledItems bounds the item slices batchItems keeps.
const maxPooledItems = 4096

// parseBatchItems is parseBatch item by item: slower, and it names the item
// and the field of the first thing wrong.
func parseBatchItems(body []byte, lane string, maxBody int64, maxItems int) ([]batchJob, *Refusal) {
	bad := func(class error, field, format string, args ...any) *Refusal {
		return refusal(class, field, format, args...)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, bad(ErrBadBody, "body", "a batch is a JSON array of {\"idempotency_key\", \"payload\"} objects")
	}
	// Room for the items of a body of small payloads (about 48 bytes an
	// item), up to maxItems, saves growing both most of the time.
	guess := min(maxItems, len(body)/48+1)
	jobs := make([]batchJob, 0, guess)
	seen := make(map[string]int, guess)
	var it api.BatchItem // reused: decoding makes it escape
	var raw json.RawMessage
	for dec.More() {
		i := len(jobs)
		if i >= maxItems {
			return nil, bad(ErrBodyTooLarge, "/"+strconv.Itoa(i),
				"the batch has more than http.max_batch_items (%d) items; split it", maxItems)
		}
		it = api.BatchItem{}
		if err := dec.Decode(&raw); err != nil {
			return nil, itemError(err, i)
		}
		if err := decodeStrict(raw, &it); err != nil {
			return nil, itemError(err, i)
		}
		job, rf := checkItem(it, i, lane, maxBody)
		if rf != nil {
			return nil, rf
		}
		bj := batchJob{job: job, first: -1, when: itemWhen(it), given: it.IdempotencyKey != ""}
		if f, ok := seen[job.ID]; ok {
			bj.first = f
		} else {
			seen[job.ID] = i
		}
		jobs = append(jobs, bj)
	}
	if _, err := dec.Token(); err != nil {
		return nil, bad(ErrBadBody, "body", "the batch array is not closed: %v", err)
	}
	if dec.More() || dec.InputOffset() < int64(len(bytes.TrimRight(body, " \t\r\n"))) {
		return nil, bad(ErrBadBody, "body", "data after the batch array")
	}
	if len(jobs) == 0 {
		return nil, bad(ErrBadBody, "body", "the batch is empty")
	}
	return jobs, nil
}

// itemError names what is wrong in item i that did not decode: an unknown,
// repeated or miscased field, a field of the wrong type, a string that is
// not UTF-8, not an object, not JSON.
func itemError(err error, i int) *Refusal {
	at := "/" + strconv.Itoa(i)
	p := &Refusal{Err: ErrBadBody, Field: at}
	var ute *json.UnmarshalTypeError
	var je *JSONError
	switch {
	case errors.As(err, &je) && je.Reason == jsonUnknown:
		p.Field += je.Pointer
		p.Detail = fmt.Sprintf("item %d: unknown field %q", i, clip(je.Key))
	case errors.As(err, &je) && je.Reason != jsonSyntax && je.Reason != jsonType:
		p.Field += je.Pointer
		p.Detail = fmt.Sprintf("item %d: %s", i, strings.TrimPrefix(err.Error(), "json: "))
	case errors.As(err, &ute) && ute.Field != "":
		p.Field += "/" + ute.Field
		p.Detail = fmt.Sprintf("item %d: %s cannot be a JSON %s", i, ute.Field, ute.Value)
	case errors.As(err, &ute):
		p.Detail = fmt.Sprintf("item %d: an item is an object {\"idempotency_key\", \"payload\"}, not %s", i, ute.Value)
	default:
		p.Detail = fmt.Sprintf("item %d is not valid JSON: %v", i, err)
	}
	return p
}

// checkItem checks item i of a batch and makes its job.
func checkItem(it api.BatchItem, i int, lane string, maxBody int64) (queue.Job, *Refusal) {
	at := "/" + strconv.Itoa(i)
	bad := func(class error, field, format string, args ...any) (queue.Job, *Refusal) {
		return queue.Job{}, refusal(class, at+field, "item %d: %s", i, fmt.Sprintf(format, args...))
	}
	job := queue.Job{ID: it.IdempotencyKey, Lane: lane, Key: it.ThrottleKey, ContentType: it.ContentType, Dest: itemDest(it), Callback: it.Callback}
	if job.ID != "" {
		if err := queue.ValidGivenID(lane, job.ID); err != nil {
			return bad(ErrBadBody, "/idempotency_key", "idempotency_key: %v", err)
		}
	} else {
		job.ID = nuid.Next()
	}
	if it.ThrottleKey != "" {
		if err := queue.ValidKey(it.ThrottleKey); err != nil {
			return bad(ErrBadBody, "/throttle_key", "throttle_key: %v", err)
		}
	}
	if rf := itemTrace(it.Trace, i, &job); rf != nil {
		return queue.Job{}, rf
	}
	if len(it.ContentType) > maxContentType {
		return bad(ErrBadBody, "/content_type", "content_type is %d bytes; at most %d are allowed", len(it.ContentType), maxContentType)
	}
	for j := 0; j < len(it.ContentType); j++ {
		if c := it.ContentType[j]; c < ' ' || c > '~' {
			return bad(ErrBadBody, "/content_type", "content_type has a byte 0x%02x at %d; only visible ASCII and spaces are allowed", c, j)
		}
	}
	switch {
	case it.Payload != nil && it.PayloadBase64 != "":
		return bad(ErrBadBody, "/payload_base64", "give payload or payload_base64, not both")
	case it.Payload != nil:
		job.Payload = []byte(it.Payload)
		if job.ContentType == "" {
			job.ContentType = jsonContentType
		}
	case it.PayloadBase64 != "":
		b, err := base64.StdEncoding.DecodeString(it.PayloadBase64)
		if err != nil {
			return bad(ErrBadBody, "/payload_base64", "not base64 (standard alphabet, padded): %v", err)
		}
		job.Payload = b
		if job.ContentType == "" {
			job.ContentType = binaryContentType
		}
	default:
		return bad(ErrBadBody, "/payload", "payload (any JSON) or payload_base64 is required")
	}
	if int64(len(job.Payload)) > maxBody {
		field := "/payload"
		if it.PayloadBase64 != "" {
			field = "/payload_base64"
		}
		return bad(ErrBodyTooLarge, field, "the payload is %d bytes, over the lane's max_body of %d", len(job.Payload), maxBody)
	}
	return job, nil
}

// storeBatch decides on every job of a checked batch, stores the ones
// admission takes in one window of asynchronous publishes, and answers one
// result per job.
func (h *Handler) storeBatch(w http.ResponseWriter, r *http.Request, name string, lane Lane, jobs []batchJob) {
	ctx := r.Context()
	results := make([]api.BatchResult, len(jobs))
	// fail answers item i with the problem of err (problemFor), counted
	// by reason.
	fail := func(i int, err error, reason string) {
		p := problemFor(err)
		p.Lane, p.Instance = name, clip(r.URL.Path)
		results[i] = api.BatchResult{Status: p.Status, ID: jobs[i].job.ID, Problem: &p}
		h.cfg.Metrics.Rejected.WithLabelValues(name, reason).Inc()
		if reason == "idempotency_key_conflict" {
			// Who tried another caller's key is logged, as a single
			// submission's refusal is.
			h.cfg.Logger.Info("batch item rejected", "caller", callerOf(r), "ip", clientIP(r), "lane", name, "reason", reason, "status", p.Status, "field", p.Field)
		}
	}
	// Every job is the caller's (its API key's, with keys).
	owner := h.ownerOf(r)
	for i := range jobs {
		jobs[i].job.Owner = owner
	}
	// The items that are new in this batch, decided as if they came one
	// after the other. (Keyed lanes decide per key.)
	fresh := make([]int, 0, len(jobs))
	var delayed []int // new items that asked for a delay: not decided now
	for i, bj := range jobs {
		switch {
		case bj.first >= 0:
		case !bj.job.NotBefore.IsZero():
			delayed = append(delayed, i)
		default:
			fresh = append(fresh, i)
		}
	}
	// On a keyed lane each key has a bucket of its own: the items of one key
	// are decided together, in their order, beside the other keys'. A lane
	// without keys (or a batch of one key) is one call whose answers are
	// the batch's.
	var decs []admission.Decision
	var errs []error
	switch {
	case len(fresh) == 0:
		// Nothing to decide (never so today: the first item of an id is fresh).
	case oneKey(jobs, fresh):
		key := jobs[fresh[0]].job.Key
		decs, errs = h.cfg.Admitter.DecideN(ctx, lane.forKey(key), key, len(fresh))
	default:
		decs, errs = make([]admission.Decision, len(fresh)), make([]error, len(fresh))
		byKey := map[string][]int{} // key → indexes into fresh
		var keys []string
		for k, i := range fresh {
			key := jobs[i].job.Key
			if _, ok := byKey[key]; !ok {
				keys = append(keys, key)
			}
			byKey[key] = append(byKey[key], k)
		}
		for _, key := range keys {
			ks := byKey[key]
			d, e := h.cfg.Admitter.DecideN(ctx, lane.forKey(key), key, len(ks))
			for j, k := range ks {
				decs[k], errs[k] = d[j], e[j]
			}
		}
	}
	keeps := lane.ResultsMaxWait > 0 && h.cfg.Records != nil
	var created []createdRecord
	if keeps {
		created = h.createRecords(ctx, jobs, fresh, errs)
	}
	var recorded []int // items answered from an earlier job's record
	var (
		toStore = make([]queue.Job, 0, len(fresh))
		stored  = make([]struct{ i, k int }, 0, len(fresh)) // batch index and decision index of toStore[j]
		waits   = map[int]func(context.Context, time.Duration) (queue.Told, bool){}
		last    admission.Decision
		decided bool
	)
	for k, i := range fresh {
		if err := errs[k]; err != nil {
			if err = admissionRefusal(name, err); errors.Is(err, admission.ErrBacklogFull) {
				fail(i, err, "backlog_full")
			} else {
				fail(i, err, "admission_error")
			}
			continue
		}
		last, decided = decs[k], true
		job := jobs[i].job
		if keeps {
			// A lane with records: the item's record first
			// (create-if-absent), as a single submission's.
			rev, first, err := created[k].rev, created[k].first, created[k].err
			switch {
			case errors.Is(err, records.ErrExists) && first.Owner != job.Owner:
				fail(i, itemConflict(name, i), "idempotency_key_conflict")
				continue
			case errors.Is(err, records.ErrExists):
				results[i] = api.BatchResult{Status: http.StatusAccepted, ID: job.ID, State: first.State, Duplicate: true}
				recorded = append(recorded, i)
				continue
			case err != nil:
				fail(i, err, "records_unavailable")
				continue
			}
			job.RecordRev = rev
		}
		if lane.startsNow(decs[k]) && h.cfg.Assignments != nil {
			wait, cancel := h.cfg.Assignments.Expect(name, job.ID)
			defer cancel()
			waits[i] = wait
			job.Notify = h.cfg.Assignments.Address()
		}
		toStore = append(toStore, job)
		stored = append(stored, struct{ i, k int }{i, k})
	}
	var pubs []queue.BatchResult
	if len(toStore) > 0 {
		var err error
		pubs, err = h.cfg.Publisher.PublishBatch(ctx, name, toStore)
		if err != nil {
			// The lane vanished between the lookup and the publish.
			pubs = make([]queue.BatchResult, len(toStore))
			for k := range pubs {
				pubs[k].Err = err
			}
		}
	}
	storedAt := time.Now()
	// The jobs queued ahead of the whole batch (on a keyed lane, of each
	// key's items); each job's decision adds the ones of the batch (of its
	// key) before it.
	aheadOf := map[string]int64{}
	etaOf := func(dec admission.Decision, key string) int64 {
		ahead, ok := aheadOf[key]
		if !ok {
			first, mine := -1, int64(0)
			for j, pub := range pubs {
				if pub.Err == nil && !pub.Duplicate && toStore[j].Key == key {
					if first < 0 {
						first = j
					}
					mine++
				}
			}
			if first >= 0 {
				started := 0
				if key != "" && lane.KeyStarted != nil {
					if n, err := lane.KeyStarted(ctx, key); err == nil {
						started = n
					}
				}
				ahead = h.ahead(ctx, dec, name, key, pubs[first].Seq, started)
				if key != "" {
					// A key's count holds the batch's later items of the
					// key too: the decisions count those.
					ahead = max(ahead-(mine-1), 0)
				}
			}
			aheadOf[key] = ahead
		}
		return dec.ETA(ahead).Milliseconds()
	}
	deadline := storedAt.Add(lane.AdmitWait)
	counts := map[string]int{}
	for j, st := range stored {
		i, pub, dec := st.i, pubs[j], decs[st.k]
		if err := pub.Err; err != nil {
			if keeps {
				h.undoRecord(toStore[j], &submission{rev: toStore[j].RecordRev})
			}
			h.refuseStore(func(err error, reason string) { fail(i, err, reason) }, name, lane, err, "publish")
			continue
		}
		id := jobs[i].job.ID
		if pub.Duplicate && keeps && toStore[j].RecordRev != 0 && h.storedByAnother(ctx, toStore[j], pub.Seq) {
			// As a single submission's: the id is another caller's
			// job, stored without a record.
			h.undoRecord(toStore[j], &submission{rev: toStore[j].RecordRev})
			fail(i, itemConflict(name, i), "idempotency_key_conflict")
			continue
		}
		out := api.BatchResult{Status: http.StatusAccepted, ID: id, State: api.StateQueued}
		wait := waits[i]
		switch {
		case pub.Duplicate:
			out.Duplicate = true
			if first, ok := h.answers.get(name, id); ok {
				out.State = first
			}
			if out.State == api.StateQueued {
				out.ETAMillis = h.eta(ctx, dec, lane, name, jobs[i].job.Key, pub.Seq).Milliseconds()
			}
		case wait != nil:
			slot, told := wait(ctx, max(time.Until(deadline), 0))
			waited := time.Since(storedAt) + slot.In
			switch {
			case told && slot.Free && slot.In <= atOnce && waited <= max(startsAtOnce, dec.Limit.Period()):
				out.State = api.StateAdmitted
			case told:
				out.ETAMillis = max(slot.In, 0).Milliseconds()
			default:
				out.ETAMillis = etaOf(dec, jobs[i].job.Key)
			}
		default:
			out.ETAMillis = etaOf(dec, jobs[i].job.Key)
		}
		if !pub.Duplicate {
			h.answers.put(name, id, out.State)
			counts[string(out.State)]++
		} else {
			counts["duplicate"]++
		}
		results[i] = out
	}
	for _, i := range delayed {
		h.storeDelayedItem(ctx, name, lane, delayedItem{i: i, job: jobs[i].job, given: jobs[i].given, out: &results[i], fail: func(err error, reason string) { fail(i, err, reason) }}, counts, keeps)
	}
	// A repeated id within the batch: the answer of its first item, as a
	// duplicate (or the same refusal).
	for i, bj := range jobs {
		if bj.first < 0 {
			continue
		}
		res := results[bj.first]
		res.ID = bj.job.ID
		if res.Problem == nil {
			res.Duplicate = true
			counts["duplicate"]++
		}
		results[i] = res
	}
	counts["duplicate"] += len(recorded)
	for state, n := range counts {
		h.cfg.Metrics.Submitted.WithLabelValues(name, state, "http").Add(float64(n))
	}
	answer := api.BatchAccepted{Lane: name, Results: results}
	for _, res := range results {
		if res.Problem == nil {
			answer.Accepted++
		} else {
			answer.Failed++
		}
	}
	if answer.Accepted > 0 && decided {
		last.Remaining = max(last.Remaining-1, 0)
		setRateHeaders(w.Header(), r, name, last)
	}
	status := http.StatusAccepted
	if answer.Failed > 0 {
		status = http.StatusMultiStatus
	}
	buf := answerBufs.Get().(*[]byte)
	*buf = appendBatchAccepted((*buf)[:0], answer)
	// A length known up front spares the answer the chunked encoding
	// net/http gives one larger than its buffer.
	hdr := w.Header()
	hdr["Content-Type"] = []string{jsonContentType}
	hdr["Content-Length"] = []string{strconv.Itoa(len(*buf))}
	w.WriteHeader(status)
	_, _ = w.Write(*buf)
	if cap(*buf) <= 1<<20 {
		answerBufs.Put(buf)
	}
}

// oneKey reports whether the jobs at fresh share one throttle key.
func oneKey(jobs []batchJob, fresh []int) bool {
	for _, i := range fresh {
		if jobs[i].job.Key != jobs[fresh[0]].job.Key {
			return false
		}
	}
	return true
}

// appendBatchAccepted appends a as encoding/json would write it, newline
// included: the results by hand, a result's problem (the rare case)
// through encoding/json.
func appendBatchAccepted(b []byte, a api.BatchAccepted) []byte {
	b = append(b, `{"lane":`...)
	b = jsonenc.AppendString(b, a.Lane)
	b = append(b, `,"accepted":`...)
	b = strconv.AppendInt(b, int64(a.Accepted), 10)
	b = append(b, `,"failed":`...)
	b = strconv.AppendInt(b, int64(a.Failed), 10)
	b = append(b, `,"results":`...)
	if a.Results == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, r := range a.Results {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendBatchResult(b, r)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

func appendBatchResult(b []byte, r api.BatchResult) []byte {
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, `,"id":`...)
	b = jsonenc.AppendString(b, r.ID)
	if r.State != "" {
		b = append(b, `,"state":`...)
		b = jsonenc.AppendString(b, string(r.State))
	}
	b = append(b, `,"eta_ms":`...)
	b = strconv.AppendInt(b, r.ETAMillis, 10)
	if r.Duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	if r.Problem != nil {
		p, err := json.Marshal(r.Problem)
		if err != nil {
			// A Problem is strings and integers: it always encodes.
			p = []byte("null")
		}
		b = append(b, `,"problem":`...)
		b = append(b, p...)
	}
	return append(b, '}')
}

// batchCreates bounds the record creates of one batch under way at once.
const batchCreates = 64

// createdRecord is the answer to one item's create-if-absent.
type createdRecord struct {
	rev   uint64
	first api.JobRecord
	err   error
}

// createRecords creates the records of a batch's admitted items (those of
// fresh whose errs is nil), indexed as fresh: the creates are sent
// together, at most batchCreates at once, since one after the other a
// batch of 1,000 items waited for 1,000 round trips. The items' ids are
// distinct (a batch's repeats are answered before), so no two creates
// race for one record.
func (h *Handler) createRecords(ctx context.Context, jobs []batchJob, fresh []int, errs []error) []createdRecord {
	out := make([]createdRecord, len(fresh))
	sem := make(chan struct{}, batchCreates)
	var wg sync.WaitGroup
	for k, i := range fresh {
		if errs[k] != nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rev, first, err := h.createRecord(ctx, jobs[i].job)
			out[k] = createdRecord{rev: rev, first: first, err: err}
		})
	}
	wg.Wait()
	return out
}
