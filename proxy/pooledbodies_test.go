package proxy

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestPooledBodiesStayApart: concurrent requests through the router each
// reach the replica with their own body, and the replica's answer reaches
// the client that sent it. Request bodies are read into pooled buffers
// and the upstream connections are pooled: a buffer or connection handed
// on too early would mix them up.
func TestPooledBodiesStayApart(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Body", fmt.Sprintf("%x", sha256.Sum256(b)))
		jsonChat(w, "ok", 0)
	})
	view := nopRecordView{newFakeView([]string{"m"}, fakeReplica{id: rep.URL})}
	_, srv, _ := newTestProxy(t, view, nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: testWait}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 {
				body := chatBody("m", false, fmt.Sprintf("client %d request %d %s", g, i, strings.Repeat("x", 100*(g+1))))
				resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if want := fmt.Sprintf("%x", sha256.Sum256([]byte(body))); resp.StatusCode != 200 || resp.Header.Get("X-Body") != want {
					errs <- fmt.Errorf("client %d request %d: status %d, the replica saw another body", g, i, resp.StatusCode)
					return
				}
			}
		})
	}
	waitGroup(t, &wg, "the clients")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
