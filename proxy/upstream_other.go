//go:build !unix

package proxy

import "errors"

// rawReads: elsewhere the upstream client reads through net.Conn.Read
// (readOnce and idleOpen are never called).
const rawReads = false

func readOnce(uintptr, []byte) (int, error) { return 0, errors.ErrUnsupported }

func idleOpen(uintptr) bool { return false }
