package upstream

import (
	"fmt"
	"testing"
)

// TestPutChunkHead: the loop frames a chunk's size as net/http does.
func TestPutChunkHead(t *testing.T) {
	for _, n := range []int{1, 9, 10, 15, 16, 255, 4096, 32 << 10, 1<<31 - 1} {
		var b [frameRoom]byte
		i := putChunkHead(b[:], n)
		if got, want := string(b[i:]), fmt.Sprintf("%x\r\n", n); got != want {
			t.Errorf("%d: %q, want %q", n, got, want)
		}
	}
}
