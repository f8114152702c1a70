package ratelog

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestWriterThrottles(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New(2, time.Second)
	l.now = func() time.Time { return now }
	var out bytes.Buffer
	w := Writer{W: &out, L: l}
	for i := 0; i < 10; i++ {
		if n, err := w.Write([]byte("junk\n")); n != 5 || err != nil {
			t.Fatalf("Write: %d %v", n, err)
		}
	}
	if got := strings.Count(out.String(), "junk"); got != 2 {
		t.Fatalf("%d lines passed in one window, want 2:\n%s", got, out.String())
	}
	now = now.Add(time.Second)
	_, _ = w.Write([]byte("junk\n"))
	if !strings.Contains(out.String(), "8 similar log lines suppressed") {
		t.Fatalf("no suppression report:\n%s", out.String())
	}
}

// TestWriterLetsDroppedLinesPass: lines the destination drops anyway
// (below its level) neither use the burst nor turn into a report that
// lines were suppressed.
func TestWriterLetsDroppedLinesPass(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New(2, time.Second)
	l.now = func() time.Time { return now }
	var out bytes.Buffer
	w := Writer{W: &out, L: l, Dropped: func(p []byte) bool { return bytes.HasPrefix(p, []byte("[DEBUG]")) }}
	for i := 0; i < 50; i++ {
		_, _ = w.Write([]byte("[DEBUG] stream\n"))
	}
	_, _ = w.Write([]byte("[WARN] junk\n"))
	now = now.Add(time.Second)
	_, _ = w.Write([]byte("[WARN] junk\n"))
	if strings.Contains(out.String(), "suppressed") {
		t.Fatalf("debug lines reported as suppressed:\n%s", out.String())
	}
	if got := strings.Count(out.String(), "[WARN] junk"); got != 2 {
		t.Fatalf("%d warnings passed, want 2:\n%s", got, out.String())
	}
}
