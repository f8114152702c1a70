package upstream

import (
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// testWait bounds every wait of these tests (a channel, a poll, a
// client's request): a liveness bound, never a speed assertion.
const testWait = 60 * time.Second

// TestMain bounds the requests the tests send through net/http's default
// client: a server that never answers fails the test instead of hanging
// it.
func TestMain(m *testing.M) {
	http.DefaultClient.Timeout = testWait
	os.Exit(m.Run())
}

// recv receives from ch within testWait.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// event is the i-th event of a chat stream.
func event(i int) string {
	return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
}

// waitGroup waits for wg within testWait.
func waitGroup(t testing.TB, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recv(t, done, what)
}
