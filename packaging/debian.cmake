# CPack DEB: the two components of packaging/CMakeLists.txt as two Debian packages.
#   cpack -G DEB --config <build>/CPackConfig.cmake   (after the build)
set(CPACK_PACKAGE_NAME fuselink)
set(CPACK_PACKAGE_VERSION ${FUSELINK_PACKAGE_VERSION})
set(CPACK_PACKAGE_CONTACT "fuselink developers <fuselink-dev@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL agent client)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Binaries without their debug sections (70 MB of the agent's 72).
set(CPACK_STRIP_FILES ON)

# fuselink: what the binaries link, as dpkg-shlibdeps reads it from them (the test
# checks it against ldd), and adduser for the fuselink user. The RDMA providers are
# loaded by libibverbs at run time, the CUDA driver by the agent (dlopen): neither
# shows in what it links, and a node without them still serves host memory over TCP.
set(CPACK_DEBIAN_AGENT_PACKAGE_NAME fuselink)
set(CPACK_DEBIAN_AGENT_PACKAGE_SECTION net)
set(CPACK_DEBIAN_AGENT_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_AGENT_PACKAGE_DEPENDS adduser)
set(CPACK_DEBIAN_AGENT_PACKAGE_RECOMMENDS ibverbs-providers)
set(CPACK_DEBIAN_AGENT_PACKAGE_SUGGESTS "openssl, libcuda1")
# Each description's first line is the package's synopsis (Debian policy 5.6.13).
set(CPACK_DEBIAN_AGENT_DESCRIPTION "GPU cluster data-movement agent for KV caches
fuselink-agent moves KV-cache blocks between the GPUs of a cluster over every NIC \
(TCP or RDMA verbs). This package holds the agent, fuselinkctl, a systemd unit \
(fuselink-agent.service) with its flag file in /etc/fuselink, the Grafana \
dashboards and the Prometheus alert rules.")
set(CPACK_DEBIAN_AGENT_PACKAGE_CONTROL_EXTRA
  ${CMAKE_CURRENT_SOURCE_DIR}/debian/conffiles
  ${CMAKE_CURRENT_SOURCE_DIR}/debian/postinst
  ${CMAKE_CURRENT_SOURCE_DIR}/debian/prerm
  ${CMAKE_CURRENT_SOURCE_DIR}/debian/postrm)

# libfuselink-client-dev: a static library, so its users need the -dev packages of
# what it links. Its generated headers refuse another protobuf (or gRPC) minor
# release and its objects name abseil's versioned namespace, so each is bounded to
# the release it was built with.
function(fl_dev_range out package version)
  string(REGEX MATCH "^[0-9]+(\\.[0-9]+)?" release "${version}")
  string(REGEX MATCH "[0-9]+$" last "${release}")
  math(EXPR next "${last} + 1")
  string(REGEX REPLACE "[0-9]+$" "${next}" next_release "${release}")
  set(${out} "${package} (>= ${release}), ${package} (<< ${next_release})" PARENT_SCOPE)
endfunction()
fl_dev_range(fl_grpc libgrpc++-dev ${gRPC_VERSION})
fl_dev_range(fl_protobuf libprotobuf-dev ${Protobuf_VERSION})
fl_dev_range(fl_absl libabsl-dev ${absl_VERSION})
set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME libfuselink-client-dev)
set(CPACK_DEBIAN_CLIENT_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_CLIENT_PACKAGE_DEPENDS "${fl_grpc}, ${fl_protobuf}, ${fl_absl}")
set(CPACK_DEBIAN_CLIENT_DESCRIPTION "C++ client library of the fuselink agent
Lend host tensors to a fuselink agent and move KV-cache blocks between agents \
from C++: find_package(fuselink) gives the CMake target fuselink::client, \
pkg-config the module fuselink-client.")

include(CPack)
