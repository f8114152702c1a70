package sim

import "testing"

// The written counts cover a router's last writtenLog placements, as the
// proxy's place book does: a forwarded request takes a place in the window
// and writes nothing, and an own placement's blocks leave with it.
func TestWrittenBookWindow(t *testing.T) {
	b := newWrittenBook(3)
	b.place(0, 5, true)
	b.place(1, 7, false) // forwarded to this router: not its write
	b.place(2, -1, true) // a match past the prompt writes nothing
	if b.blocks[0] != 5 || b.blocks[1] != 0 || b.blocks[2] != 0 {
		t.Fatalf("written %v, want [5 0 0]", b.blocks)
	}
	for range writtenLog - 3 {
		b.place(2, 1, true)
	}
	if b.blocks[0] != 5 || b.blocks[2] != writtenLog-3 {
		t.Fatalf("a full window: written %v, want [5 0 %d]", b.blocks, writtenLog-3)
	}
	b.place(1, 2, true) // pushes the first placement out
	if b.blocks[0] != 0 || b.blocks[1] != 2 {
		t.Fatalf("after the window moved: written %v, want replica 0 at 0, 1 at 2", b.blocks)
	}
}
