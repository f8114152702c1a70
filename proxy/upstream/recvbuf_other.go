//go:build !unix

package upstream

// setRecvBuffer leaves the system's receive buffer elsewhere: the bound
// is a Linux (unix) one, where the kernel autotunes it to megabytes.
func setRecvBuffer(uintptr, int) error { return nil }
