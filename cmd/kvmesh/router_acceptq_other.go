//go:build !linux

package main

import (
	"context"
	"net"
)

// awaitAcceptQueue reads the accept queue on Linux only; elsewhere the
// close finds what it finds.
func awaitAcceptQueue(context.Context, net.Listener) error { return nil }
