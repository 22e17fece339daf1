package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/worker"
)

// A pool of two workers serving the lane "emails", whose target is
// {nats: {subject: emails.work, mode: pull}}. The throttler paces the jobs;
// each worker asks for its next one when it is free.
func Example() {
	natsURL, stopThrottler := exampleThrottler("emails", "emails.work")
	defer stopThrottler()

	nc, err := nats.Connect(natsURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()

	done := make(chan string)
	pool, err := worker.New(nc, worker.Config{Subject: "emails.work", Concurrency: 2},
		worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if len(job.Payload) == 0 {
				return worker.Dead(errors.New("empty email")) // to the dead letters
			}
			// … send the email; a plain error retries it after the lane's
			// backoff, worker.RetryAfter(d, err) after d.
			done <- fmt.Sprintf("sent %s (attempt %d): %s", job.ID, job.Attempt, job.Payload)
			return nil
		}))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stopped := make(chan error)
	go func() { stopped <- pool.Run(ctx) }()

	// A job, as any service would publish it.
	js, _ := jetstream.New(nc)
	msg := nats.NewMsg("throttle.emails")
	msg.Data = []byte("hello")
	if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID("welcome-42")); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-done)

	stop() // stops asking, hands back what it holds, waits for running jobs
	fmt.Println("stopped:", <-stopped)
	// Output:
	// sent welcome-42 (attempt 1): hello
	// stopped: <nil>
}

// exampleThrottler runs a nats-server and one throttler instance with a
// pull-mode lane, until stop is called.
func exampleThrottler(lane, subject string) (natsURL string, stop func()) {
	dir, err := os.MkdirTemp("", "worker-example")
	if err != nil {
		panic(err)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		panic(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		panic("nats-server not ready")
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.NATS.URL = srv.ClientURL()
	cfg.NATS.DataDir = dir
	rate, err := bucket.ParseRate("10/s")
	if err != nil {
		panic(err)
	}
	cfg.Lanes = []config.Lane{{Name: lane, Rate: rate, Burst: 1, MaxInflight: 2, MaxBacklog: 1000,
		Target: config.Target{NATS: &config.NATSTarget{Subject: subject, Mode: config.NATSModePull}}}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	svc := service.New(cfg, slog.New(slog.DiscardHandler), nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-errc:
		panic(err)
	}
	return srv.ClientURL(), func() {
		cancel()
		<-errc
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}
}
