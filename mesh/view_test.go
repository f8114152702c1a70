package mesh_test

import (
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
)

// Mesh is the proxy's view of the cluster.
var _ proxy.View = (*mesh.Mesh)(nil)
