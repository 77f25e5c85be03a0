/*
 * The declared internal API of the topology layer for zpp's own tools
 * (zpp-topo): the node map and its parser (src/topology/topo.h).  Not
 * installed; link zpp_static.
 */
#ifndef ZPP_INTERNAL_TOPO_H
#define ZPP_INTERNAL_TOPO_H

#include "../../topology/topo.h"

#endif /* ZPP_INTERNAL_TOPO_H */
