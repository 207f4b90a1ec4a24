/*
 * node/dsnode.h: the public face of node/ for tools/ (dsbench, dslaunch,
 * dsviz). Tools include this header and nothing else from node/.
 */
#ifndef DS_NODE_DSNODE_H
#define DS_NODE_DSNODE_H

#include "node/crypto.h"
#include "node/log.h"
#include "node/train.h"
#include "node/wire.h"

#endif
