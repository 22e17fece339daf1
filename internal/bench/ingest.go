package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/throttler/throttler/internal/queue"
)

// ingestConns is the number of HTTP connections and of publishing goroutines.
const ingestConns = 64

// ingestPayload is the body of every submitted job (about 64 bytes).
var ingestPayload = []byte(`{"event":"bench.ingest","customer":"c-0001","amount":4200,"ok":1}`)

// runIngest: accepted jobs/s and latency of POST /v1/lanes/{lane}/jobs at 64
// connections, against raw JetStream publishes (one connection, 64
// goroutines, a Nats-Msg-Id each, like the service) to the same server and
// an identical stream. Both lanes have a tiny rate, so the drain does no
// work meanwhile and the figure is intake alone. Full runs interleave three
// rounds of each side and keep each side's best, which filters out the
// moments a noisy machine steals.
func runIngest(ctx context.Context, e *env) ([]Result, error) {
	const goal = "—"
	name := fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s (vs js.Publish ×%d)", ingestConns, ingestConns)
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	ours, ref := e.lane("ingest"), e.lane("ingestref")
	lo := laneOpts{rate: 1, burst: 1, inflight: 16, backlog: 100_000_000}
	opts := svcOpts{dataDir: e.dir("ingest"), target: sk.URL, lanes: map[string]laneOpts{ours: lo, ref: lo}}
	natsURL := e.cfg.NATSURL
	if natsURL == "" {
		// The reference reaches the service's embedded server over loopback.
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		opts.natsListen = addr
		natsURL = "nats://" + addr
	}
	cfg, err := e.serviceConfig(opts)
	if err != nil {
		return nil, err
	}
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("bench: nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	client := newClient(ingestConns)
	defer client.CloseIdleConnections()
	url := "http://" + svc.svc.Addr() + "/v1/lanes/" + ours + "/jobs"
	subject := queue.Subject(ref, "")
	prefix := nuid.Next()

	submit := func(ctx context.Context, _, _ int) error {
		_, err := post(ctx, client, url, ingestPayload, 202)
		return err
	}
	publish := func(ctx context.Context, w, i int) error {
		_, err := js.Publish(ctx, subject, ingestPayload, jetstream.WithMsgID(prefix+strconv.Itoa(w)+"."+strconv.Itoa(i)))
		return err
	}
	maxOps := 2_000_000
	// Warm up both paths: connections, JIT-free but cache- and pool-warm.
	closedLoop(ctx, ingestConns, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up http", submit)
	closedLoop(ctx, ingestConns, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up js.Publish", publish)

	rounds := 3
	if e.cfg.Smoke {
		rounds = 1
	}
	var bestOurs, bestRef loadResult
	for r := range rounds {
		o := closedLoop(ctx, ingestConns, e.dur, maxOps, e.prog, fmt.Sprintf("http round %d/%d", r+1, rounds), submit)
		if o.Err != nil && o.OK == 0 {
			return nil, fmt.Errorf("bench: ingest: every request failed: %w", o.Err)
		}
		if o.Rate() > bestOurs.Rate() {
			bestOurs = o
		}
		f := closedLoop(ctx, ingestConns, e.dur, maxOps, e.prog, fmt.Sprintf("js.Publish round %d/%d", r+1, rounds), publish)
		if f.Err != nil && f.OK == 0 {
			return nil, fmt.Errorf("bench: ingest reference: every publish failed: %w", f.Err)
		}
		if f.Rate() > bestRef.Rate() {
			bestRef = f
		}
	}
	// The floor under any HTTP intake on this machine: the same client
	// POSTing to the sink, a handler that does nothing.
	floor := closedLoop(ctx, ingestConns, e.dur, maxOps, e.prog, "http floor", func(ctx context.Context, _, _ int) error {
		_, err := post(ctx, client, sk.URL, ingestPayload, 200)
		return err
	})
	row := Result{
		ID: Ingest, Scenario: name,
		Ours:      fmt.Sprintf("%s (%s)", fmtRate(bestOurs.Rate()), fmtLat(bestOurs.Lat)),
		Reference: fmt.Sprintf("%s (%s)", fmtRate(bestRef.Rate()), fmtLat(bestRef.Lat)),
		Ratio:     fmtRatio(bestOurs.Rate(), bestRef.Rate()),
		Goal:      goal,
		Verdict:   NoGoal,
	}
	if bestOurs.Failed+bestRef.Failed > 0 {
		row.Note = fmt.Sprintf("%d requests and %d publishes failed (first: %v / %v)", bestOurs.Failed, bestRef.Failed, bestOurs.Err, bestRef.Err)
	}
	floorRow := Result{
		ID: Ingest, Scenario: fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s (vs the same client POSTing to a no-op handler)", ingestConns),
		Ours:      fmt.Sprintf("%s (%s)", fmtRate(bestOurs.Rate()), fmtLat(bestOurs.Lat)),
		Reference: fmt.Sprintf("%s (%s)", fmtRate(floor.Rate()), fmtLat(floor.Lat)),
		Ratio:     fmtRatio(bestOurs.Rate(), floor.Rate()),
		Goal:      "≥ 0.80×",
		Verdict:   verdict(bestOurs.Rate() >= 0.8*floor.Rate()),
	}
	batchRow, err := e.batchIngest(ctx, client, "http://"+svc.svc.Addr()+"/v1/lanes/"+ours+"/jobs:batch", js, subject, prefix)
	if err != nil {
		return []Result{row, floorRow}, err
	}
	return []Result{row, floorRow, batchRow}, nil
}

// Batch intake: batchConns connections POST batches of batchSize jobs; the
// reference publishes the same jobs (same payload, a Nats-Msg-Id each) with
// jetstream PublishMsgAsync in windows of batchSize from batchConns
// goroutines, and waits for each window's acknowledgements.
const (
	batchConns = 8
	batchSize  = 100
)

func (e *env) batchIngest(ctx context.Context, client *http.Client, url string, js jetstream.JetStream, subject, prefix string) (Result, error) {
	name := fmt.Sprintf("batch ingest, %d jobs a request @%d conns: jobs/s (vs js.PublishAsync, windows of %d ×%d)", batchSize, batchConns, batchSize, batchConns)
	body := func(w, i int) []byte {
		var b bytes.Buffer
		b.Grow(batchSize * (len(ingestPayload) + 64))
		b.WriteByte('[')
		for k := range batchSize {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"idempotency_key":"`)
			b.WriteString(prefix + "b" + strconv.Itoa(w) + "." + strconv.Itoa(i) + "." + strconv.Itoa(k))
			b.WriteString(`","payload":`)
			b.Write(ingestPayload)
			b.WriteByte('}')
		}
		b.WriteByte(']')
		return b.Bytes()
	}
	submit := func(ctx context.Context, w, i int) error {
		_, err := post(ctx, client, url, body(w, i), 202)
		return err
	}
	publish := func(ctx context.Context, w, i int) error {
		futures := make([]jetstream.PubAckFuture, 0, batchSize)
		for k := range batchSize {
			f, err := js.PublishAsync(subject, ingestPayload,
				jetstream.WithMsgID(prefix+"r"+strconv.Itoa(w)+"."+strconv.Itoa(i)+"."+strconv.Itoa(k)))
			if err != nil {
				return err
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	maxOps := 200_000
	closedLoop(ctx, batchConns, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up batch", submit)
	rounds := 3
	if e.cfg.Smoke {
		rounds = 1
	}
	var bestOurs, bestRef loadResult
	for r := range rounds {
		o := closedLoop(ctx, batchConns, e.dur, maxOps, e.prog, fmt.Sprintf("batch round %d/%d", r+1, rounds), submit)
		if o.Err != nil && o.OK == 0 {
			return Result{}, fmt.Errorf("bench: batch ingest: every request failed: %w", o.Err)
		}
		if o.Rate() > bestOurs.Rate() {
			bestOurs = o
		}
		f := closedLoop(ctx, batchConns, e.dur, maxOps, e.prog, fmt.Sprintf("js.PublishAsync round %d/%d", r+1, rounds), publish)
		if f.Err != nil && f.OK == 0 {
			return Result{}, fmt.Errorf("bench: batch reference: every window failed: %w", f.Err)
		}
		if f.Rate() > bestRef.Rate() {
			bestRef = f
		}
	}
	ours, ref := batchSize*bestOurs.Rate(), batchSize*bestRef.Rate()
	row := Result{
		ID: Ingest, Scenario: name,
		Ours:      fmt.Sprintf("%s (per request: %s)", fmtRate(ours), fmtLat(bestOurs.Lat)),
		Reference: fmt.Sprintf("%s (per window: %s)", fmtRate(ref), fmtLat(bestRef.Lat)),
		Ratio:     fmtRatio(ours, ref),
		Goal:      "≥ 0.80×",
		Verdict:   verdict(ours >= 0.8*ref),
	}
	if bestOurs.Failed+bestRef.Failed > 0 {
		row.Note = fmt.Sprintf("%d requests and %d windows failed (first: %v / %v)", bestOurs.Failed, bestRef.Failed, bestOurs.Err, bestRef.Err)
	}
	return row, nil
}
