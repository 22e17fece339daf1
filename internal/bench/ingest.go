package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
)

// ingestConns is the number of HTTP connections and of publishing goroutines.
const ingestConns = 64

// ingestPayload is the body of every submitted job (about 64 bytes).
var ingestPayload = []byte(`{"event":"bench.ingest","customer":"c-0001","amount":4200,"ok":1}`)

// runIngest: accepted jobs/s and latency of POST /v1/lanes/{lane}/jobs at 64
// connections, against three references measured in the same rounds, each
// doing part of the same work on the same machine:
//
//   - the HTTP floor: the same client POSTing the same body to a handler
//     that reads it and answers 202, on a server with the service's HTTP
//     bounds (the goal's reference);
//   - the durable floor: the same, where the handler also stores the body
//     with jetstream.Publish and a Nats-Msg-Id, waiting for the ack, as the
//     service does, on an identical stream of the same server over a NATS
//     connection of the same kind as the service's (in-process with the
//     embedded server, TCP with --nats-url);
//   - jetstream.Publish from 64 goroutines on that connection, no HTTP.
//
// Every lane has a tiny rate, so the drain does no work meanwhile and the
// figure is intake alone. Full runs interleave three rounds of every side
// and keep each side's best, which filters out the moments a noisy machine
// steals.
func runIngest(ctx context.Context, e *env) ([]Result, error) {
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	ours, ref := e.lane("ingest"), e.lane("ingestref")
	lo := laneOpts{rate: 1, burst: 1, inflight: 16, backlog: 100_000_000}
	opts := svcOpts{dataDir: e.dir("ingest"), target: sk.URL, lanes: map[string]laneOpts{ours: lo, ref: lo}}
	cfg, err := e.serviceConfig(opts)
	if err != nil {
		return nil, err
	}
	withDest(&cfg, ours)
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	// The references publish over a connection of the kind the service
	// publishes over: in-process to the embedded server, or TCP to
	// --nats-url.
	var nc *nats.Conn
	if srv := svc.svc.EmbeddedNATS(); srv != nil {
		nc, err = queue.ConnectEmbedded(srv, nats.Name("throttler-bench"))
	} else {
		nc, err = nats.Connect(cfg.NATS.URL, nats.Timeout(5*time.Second))
	}
	if err != nil {
		return nil, fmt.Errorf("bench: nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	subject := queue.Subject(ref, "")
	rs, err := startRefServer(cfg.HTTP, js, subject)
	if err != nil {
		return nil, err
	}
	defer rs.close()
	client := newClient(ingestConns)
	defer client.CloseIdleConnections()
	url := "http://" + svc.svc.Addr() + "/v1/lanes/" + ours + "/jobs"
	prefix := nuid.Next()
	// Ids count up over the whole run: a warm-up or a round that gave the
	// ids of an earlier loop again would be answered as duplicates, which
	// JetStream does not store.
	var seq atomic.Int64

	sides := []side{
		{name: "http", op: func(ctx context.Context, _, _ int) error {
			_, err := post(ctx, client, url, ingestPayload, 202)
			return err
		}},
		{name: "http floor", op: func(ctx context.Context, _, _ int) error {
			_, err := post(ctx, client, rs.base+"/noop", ingestPayload, 202)
			return err
		}},
		{name: "durable floor", op: func(ctx context.Context, _, _ int) error {
			_, err := post(ctx, client, rs.base+"/publish", ingestPayload, 202)
			return err
		}},
		{name: "js.Publish", op: func(ctx context.Context, _, _ int) error {
			_, err := js.Publish(ctx, subject, ingestPayload, jetstream.WithMsgID(prefix+"p"+strconv.FormatInt(seq.Add(1), 10)))
			return err
		}},
		{name: "http with destination headers", op: func(ctx context.Context, _, i int) error {
			return postDest(ctx, client, url, ingestPayload, i)
		}},
	}
	best, err := e.interleave(ctx, ingestConns, 2_000_000, sides)
	if err != nil {
		return nil, err
	}
	o, floor, durable, direct, withHeaders := best[0], best[1], best[2], best[3], best[4]
	lat := func(r loadResult) string { return fmt.Sprintf("%s (%s)", fmtRate(r.Rate()), fmtLat(r.Lat)) }
	row := func(scenario string, r loadResult, goal string) Result {
		res := Result{ID: Ingest, Scenario: scenario, Ours: lat(o), Reference: lat(r), Ratio: fmtRatio(o.Rate(), r.Rate()),
			Goal: goal, Verdict: NoGoal}
		if goal != "—" {
			res.Verdict = verdict(o.Rate() >= 0.8*r.Rate())
		}
		res.Note = cpuNote(o, r, 1)
		if o.Failed+r.Failed > 0 {
			res.Note += fmt.Sprintf("; %d requests and %d of the reference failed (first: %v / %v)", o.Failed, r.Failed, o.Err, r.Err)
		}
		return res
	}
	rows := []Result{
		row(fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s (vs the same client POSTing to a no-op handler)", ingestConns), floor, "≥ 0.80×"),
		row(fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s (vs a handler storing each body with js.Publish + Nats-Msg-Id)", ingestConns), durable, "—"),
		row(fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s (vs js.Publish ×%d, no HTTP)", ingestConns, ingestConns), direct, "—"),
	}
	destRow := Result{ID: Ingest,
		Scenario: fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s with Throttle-Method, Throttle-Path and 2 Throttle-Forward headers (vs without)", ingestConns),
		Ours:     lat(withHeaders), Reference: lat(o), Ratio: fmtRatio(withHeaders.Rate(), o.Rate()),
		Goal: "≥ 0.95×", Verdict: verdict(withHeaders.Rate() >= 0.95*o.Rate()),
		Note: "the same lane and client; each job's method, path and headers are checked against the lane's lists and stored with it; " + cpuNote(withHeaders, o, 1)}
	rows = append(rows, destRow)
	batchRows, err := e.batchIngest(ctx, client, "http://"+svc.svc.Addr()+"/v1/lanes/"+ours+"/jobs:batch", rs, js, subject, prefix, &seq)
	return append(rows, batchRows...), err
}

// side is one of the loops a scenario compares.
type side struct {
	name string
	op   func(ctx context.Context, worker, i int) error
}

// interleave warms every side up, then runs rounds of every side one after
// the other (three in a full run, one with --smoke) with workers goroutines
// and keeps each side's best round, with the CPU time the whole process
// (load, service, NATS) used during it. A side whose every call failed in a
// round ends the scenario.
func (e *env) interleave(ctx context.Context, workers, maxOps int, sides []side) ([]loadResult, error) {
	for _, s := range sides {
		closedLoop(ctx, workers, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up "+s.name, s.op)
	}
	rounds := 3
	if e.cfg.Smoke {
		rounds = 1
	}
	best := make([]loadResult, len(sides))
	for r := range rounds {
		for k, s := range sides {
			cpu0, cerr := cpuTime(os.Getpid())
			res := closedLoop(ctx, workers, e.dur, maxOps, e.prog, fmt.Sprintf("%s round %d/%d", s.name, r+1, rounds), s.op)
			if cpu1, err := cpuTime(os.Getpid()); err == nil && cerr == nil {
				res.CPU = cpu1 - cpu0
			}
			if res.Err != nil && res.OK == 0 {
				return nil, fmt.Errorf("bench: ingest: %s: every call failed: %w", s.name, res.Err)
			}
			if res.Rate() > best[k].Rate() {
				best[k] = res
			}
		}
	}
	return best, nil
}

// refServer serves the references of the intake rows that cross HTTP, on
// loopback, with the service's HTTP bounds:
//
//   - /noop reads the body and answers 202 (the HTTP floor);
//   - /publish reads the body and stores it with jetstream.Publish and a
//     fresh Nats-Msg-Id, then answers 202 with the id;
//   - /batch decodes a batch body (encoding/json, [{"idempotency_key",
//     "payload"}]), stores every payload with jetstream.PublishAsync and its
//     key as Nats-Msg-Id in one window, waits for every ack and answers 202
//     with the count.
type refServer struct {
	base    string
	srv     *http.Server
	js      jetstream.JetStream
	subject string
}

func startRefServer(bounds config.HTTP, js jetstream.JetStream, subject string) (*refServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: reference server: %w", err)
	}
	rs := &refServer{base: "http://" + ln.Addr().String(), js: js, subject: subject}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /noop", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /publish", rs.publish)
	mux.HandleFunc("POST /batch", rs.batch)
	rs.srv = &http.Server{Handler: mux, ReadHeaderTimeout: bounds.ReadHeaderTimeout.D(),
		ReadTimeout: bounds.ReadTimeout.D(), IdleTimeout: bounds.IdleTimeout.D()}
	go func() { _ = rs.srv.Serve(ln) }()
	return rs, nil
}

func (rs *refServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = rs.srv.Shutdown(ctx)
}

func readAll(r *http.Request) ([]byte, error) {
	if r.ContentLength > 0 && r.ContentLength <= 16<<20 {
		b := make([]byte, r.ContentLength)
		_, err := io.ReadFull(r.Body, b)
		return b, err
	}
	return io.ReadAll(io.LimitReader(r.Body, 16<<20))
}

func (rs *refServer) publish(w http.ResponseWriter, r *http.Request) {
	body, err := readAll(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := nuid.Next()
	if _, err := rs.js.Publish(r.Context(), rs.subject, body, jetstream.WithMsgID(id)); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"id":"` + id + `"}`))
}

func (rs *refServer) batch(w http.ResponseWriter, r *http.Request) {
	body, err := readAll(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var items []struct {
		Key     string          `json:"idempotency_key"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(body, &items); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	futures := make([]jetstream.PubAckFuture, 0, len(items))
	for _, it := range items {
		f, err := rs.js.PublishAsync(rs.subject, it.Payload, jetstream.WithMsgID(it.Key))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		futures = append(futures, f)
	}
	if err := awaitAcks(r.Context(), futures); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"accepted":` + strconv.Itoa(len(items)) + "}"))
}

// awaitAcks waits for every future's acknowledgement.
func awaitAcks(ctx context.Context, futures []jetstream.PubAckFuture) error {
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

// Batch intake: batchConns connections POST batches of batchSize jobs. The
// references, in the same rounds: the same client POSTing the same bodies to
// the reference server's /batch (decode, jetstream.PublishAsync with a
// Nats-Msg-Id each in one window, wait for the acks: the same work without
// admission, checks or per-item answers), and jetstream.PublishAsync of
// the same payloads in windows of batchSize from batchConns goroutines, no
// HTTP (the reference). Both rows carry the goal, ≥ 0.80×.
const (
	batchConns = 8
	batchSize  = 100
)

func (e *env) batchIngest(ctx context.Context, client *http.Client, url string, rs *refServer, js jetstream.JetStream, subject, prefix string, seq *atomic.Int64) ([]Result, error) {
	// A fresh id for every job of the run (see runIngest).
	body := func(kind string) []byte {
		var b bytes.Buffer
		b.Grow(batchSize * (len(ingestPayload) + 64))
		b.WriteByte('[')
		for k := range batchSize {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"idempotency_key":"`)
			b.WriteString(prefix + kind + strconv.FormatInt(seq.Add(1), 10))
			b.WriteString(`","payload":`)
			b.Write(ingestPayload)
			b.WriteByte('}')
		}
		b.WriteByte(']')
		return b.Bytes()
	}
	sides := []side{
		{name: "batch", op: func(ctx context.Context, w, i int) error {
			_, err := post(ctx, client, url, body("b"), 202)
			return err
		}},
		{name: "HTTP + PublishAsync", op: func(ctx context.Context, w, i int) error {
			_, err := post(ctx, client, rs.base+"/batch", body("h"), 202)
			return err
		}},
		{name: "js.PublishAsync", op: func(ctx context.Context, _, _ int) error {
			futures := make([]jetstream.PubAckFuture, 0, batchSize)
			for range batchSize {
				f, err := js.PublishAsync(subject, ingestPayload,
					jetstream.WithMsgID(prefix+"r"+strconv.FormatInt(seq.Add(1), 10)))
				if err != nil {
					return err
				}
				futures = append(futures, f)
			}
			return awaitAcks(ctx, futures)
		}},
	}
	best, err := e.interleave(ctx, batchConns, 200_000, sides)
	if err != nil {
		return nil, err
	}
	o := best[0]
	row := func(scenario string, r loadResult, per, goal string) Result {
		ours, ref := batchSize*o.Rate(), batchSize*r.Rate()
		res := Result{ID: Ingest, Scenario: scenario,
			Ours:      fmt.Sprintf("%s (per request: %s)", fmtRate(ours), fmtLat(o.Lat)),
			Reference: fmt.Sprintf("%s (per %s: %s)", fmtRate(ref), per, fmtLat(r.Lat)),
			Ratio:     fmtRatio(ours, ref), Goal: goal, Verdict: NoGoal}
		if goal != "—" {
			res.Verdict = verdict(ours >= 0.8*ref)
		}
		res.Note = cpuNote(o, r, batchSize)
		if o.Failed+r.Failed > 0 {
			res.Note += fmt.Sprintf("; %d requests and %d of the reference failed (first: %v / %v)", o.Failed, r.Failed, o.Err, r.Err)
		}
		return res
	}
	return []Result{
		row(fmt.Sprintf("batch ingest, %d jobs a request @%d conns: jobs/s (vs the same bodies POSTed to a handler that stores them with js.PublishAsync)", batchSize, batchConns),
			best[1], "request", "≥ 0.80×"),
		row(fmt.Sprintf("batch ingest, %d jobs a request @%d conns: jobs/s (vs js.PublishAsync, windows of %d ×%d, no HTTP)", batchSize, batchConns, batchSize, batchConns),
			best[2], "window", "≥ 0.80×"),
	}, nil
}

// cpuNote gives the CPU time per job of ours and of the reference (the
// whole process: load, service, NATS), each in its best round; jobs is the
// number of jobs an operation carries. On a machine whose cores are busy a
// closed loop's rate follows its CPU per job, so the two ratios agree when
// the load holds still.
func cpuNote(o, r loadResult, jobs int) string {
	if o.CPU == 0 || r.CPU == 0 {
		return ""
	}
	ours, ref := o.CPUPerOp()/time.Duration(jobs), r.CPUPerOp()/time.Duration(jobs)
	return fmt.Sprintf("CPU per job (whole process) %s ours, %s reference: %s", fmtDur(ours), fmtDur(ref), fmtRatio(float64(ref), float64(ours)))
}
