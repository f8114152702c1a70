package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
)

// cannedReplica answers every request in memory: an SSE stream for
// streaming requests, JSON otherwise, so fuzzing exercises the whole
// handler without sockets.
type cannedReplica struct{}

func (cannedReplica) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Request: r, ContentLength: -1}
	if bytes.Contains(body, []byte(`"stream":true`)) {
		resp.Header.Set("Content-Type", "text/event-stream")
		resp.Body = io.NopCloser(strings.NewReader("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello there, friend\"}}]}\n\ndata: {\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":-1}}}\n\ndata: [DONE]\n\n"))
	} else {
		resp.Header.Set("Content-Type", "application/json")
		resp.Body = io.NopCloser(strings.NewReader(`{"choices":[{"index":0,"message":{"content":"hello there, friend"},"text":"x"}],"usage":{"prompt_tokens":-5}}`))
	}
	return resp, nil
}

// FuzzHandler sends arbitrary bodies through the whole request path.
func FuzzHandler(f *testing.F) {
	f.Add([]byte(chatBody("m", false, "hi")), true)
	f.Add([]byte(chatBody("m", true, longPrompt, "ok", "more")), true)
	f.Add([]byte(`{"model":"m","prompt":[1,2,3],"stream":true}`), false)
	f.Add([]byte(`{"model":"m","prompt":["a","b"],"cache_salt":"s"}`), false)
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`), true)
	f.Add([]byte(`{"model":"other","messages":[{"role":"user","content":"x"}]}`), true)
	f.Add([]byte(`{`), true)
	view := newFakeView([]string{"m"}, fakeReplica{id: "http://a.invalid", match: 3}, fakeReplica{id: "http://b.invalid"}, fakeReplica{id: "http://c.invalid", owner: "http://peer.invalid"})
	close(view.dones)
	view.dones = nil
	p, err := New(Config{View: nopRecordView{view}, Policy: route.DefaultPolicy(), Contract: testContract,
		Client: &http.Client{Transport: cannedReplica{}}, MaxBodyBytes: 1 << 16, Registerer: prometheus.NewRegistry()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		switch w.Code {
		case 200, 400, 404, 413:
		default:
			t.Fatalf("status %d for %q: %s", w.Code, body, w.Body)
		}
	})
}

// nopRecordView keeps the fuzzer's memory flat: it drops records.
type nopRecordView struct{ *fakeView }

func (nopRecordView) Record(string, []uint64) {}
func (nopRecordView) Forget(string, []uint64) {}
func (nopRecordView) Begin(string, float64) (func(), func()) {
	return func() {}, func() {}
}

// FuzzFindID: the Responses id reader takes any head of any answer; what
// it returns is an escape-free string of the head.
func FuzzFindID(f *testing.F) {
	f.Add([]byte(`{"id":"resp_1","object":"response"}`))
	f.Add([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\""))
	f.Add([]byte(`{"response":{"response":{"id":"x"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ok := findID(b)
		if ok && (id == "" || !bytes.Contains(b, []byte(`"`+id+`"`))) {
			t.Fatalf("findID(%q) = %q", b, id)
		}
	})
}
