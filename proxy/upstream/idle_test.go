package upstream

import (
	"testing"
	"time"
)

// TestIdleWatchWaitsLongerForTheFirstByte: until the first body byte
// (heard) the watch allows the longer first bound, a stream's wait in
// the engine's queue; once the upstream spoke, d bounds its silences.
func TestIdleWatchWaitsLongerForTheFirstByte(t *testing.T) {
	killed := make(chan struct{})
	w := &IdleWatch{d: 20 * time.Millisecond, first: time.Hour, start: time.Now(), kill: func() { close(killed) }}
	w.timer = time.AfterFunc(w.d, w.check)
	defer w.Stop()
	w.Saw() // waiting for the first byte
	select {
	case <-killed:
		t.Fatal("the watch fired before the first byte, within its first bound")
	case <-time.After(200 * time.Millisecond):
	}
	w.Heard()
	w.Saw() // the next read waits
	select {
	case <-killed:
	case <-time.After(testWait):
		t.Fatal("the watch did not fire after the first byte and d of silence")
	}
	if !w.Fired() {
		t.Error("fired() is false after the watch ended the response")
	}
}
