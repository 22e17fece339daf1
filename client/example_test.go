package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"

	"github.com/throttler/throttler/client"
)

// exampleServer starts a throttler for an example (lanes demo, failing and
// slow); in real use the server runs elsewhere.
func exampleServer() *server {
	s, err := startServer(serverOptions{}, io.Discard)
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// Submit a job with an idempotency key: a second submission with the same
// key is answered as a duplicate and not stored again.
func Example() {
	s := exampleServer()
	defer s.stop()

	c, err := client.New(s.URL) // client.WithAPIKey(secret) when the server has keys
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	opts := &client.SubmitOptions{IdempotencyKey: "order-42", ContentType: "application/json"}
	job, err := c.Submit(ctx, "demo", []byte(`{"order":42}`), opts)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored", job.ID, "in", job.Lane)

	again, err := c.Submit(ctx, "demo", []byte(`{"order":42}`), opts)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("duplicate:", again.Duplicate)
	// Output:
	// stored order-42 in demo
	// duplicate: true
}

// A refusal is an *Error with the status and the RFC 9457 problem; match on
// the problem's type or on a sentinel, not on the text.
func ExampleError() {
	s := exampleServer()
	defer s.stop()
	c, _ := client.New(s.URL)

	_, err := c.Submit(context.Background(), "no-such-lane", []byte("x"), nil)
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Println(e.StatusCode, e.Problem.Type, "field:", e.Problem.Field)
	}
	fmt.Println("not found:", errors.Is(err, client.ErrNotFound))
	// Output:
	// 404 urn:throttler:problem:unknown-lane field: lane
	// not found: true
}

// Change a lane's limits on every instance, then read them back.
func ExampleClient_SetLane() {
	s := exampleServer()
	defer s.stop()
	c, _ := client.New(s.URL)
	ctx := context.Background()

	burst := 5
	if _, err := c.SetLane(ctx, "demo", client.LaneChange{Rate: "600/min", Burst: &burst}); err != nil {
		log.Fatal(err)
	}
	lanes, err := c.Lanes(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range lanes {
		fmt.Printf("%s: %g/s, burst %d\n", l.Name, l.Rate, l.Burst)
	}
	// Output:
	// demo: 10/s, burst 5
	// failing: 200/s, burst 10
	// slow: 2/s, burst 1
}
