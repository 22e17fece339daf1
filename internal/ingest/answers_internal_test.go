package ingest

import (
	"strconv"
	"testing"
)

func TestAnswersRememberAndForgetOldestFirst(t *testing.T) {
	a := newAnswers(answerShards * 4) // four answers a shard
	a.put("l", "a", "queued")
	a.put("l", "a", "admitted") // replaced, not a second entry
	if got, ok := a.get("l", "a"); !ok || got != "admitted" {
		t.Fatalf("get a = %q, %v; want admitted", got, ok)
	}
	if _, ok := a.get("other", "a"); ok {
		t.Fatal("an answer of lane l was found under lane other")
	}
	// Fill a's shard with four newer ids: a, the oldest, is forgotten, and
	// the four are remembered.
	sh := a.shard("a")
	var newer []string
	for i := 0; len(newer) < 4; i++ {
		if id := "n" + strconv.Itoa(i); a.shard(id) == sh {
			newer = append(newer, id)
			a.put("l", id, "queued")
		}
	}
	if _, ok := a.get("l", "a"); ok {
		t.Fatal("the oldest answer of a full shard was kept")
	}
	for _, id := range newer {
		if _, ok := a.get("l", id); !ok {
			t.Fatalf("answer %s forgotten with room for it", id)
		}
	}
	if n := len(sh.state); n != 4 {
		t.Fatalf("shard holds %d answers, want 4", n)
	}
}
