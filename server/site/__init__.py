"""A covey site: the broker's TLS and identities, and a bundle per board.

``covey site init DIR --host NAME --ip ADDR --devices ID...`` makes, in one folder,
a private CA, the broker's certificate (every host name and address in its
subjectAltName), a password (and optionally a client certificate) per device and for
the coordinator, mosquitto's password file, ACL and configuration, and one bundle per
board that ``firmware_scripts/provision-device.sh`` installs. The broker enforces
identity: a device's user name is its id, and the ACL lets it write only topics that
carry that id (:mod:`server.site.mosquitto`).

* :mod:`server.site.spec`: what a site is, and the checks on every value;
* :mod:`server.site.certs`: the CA and the certificates;
* :mod:`server.site.mosquitto`: password hashes, the ACL, ``mosquitto.conf``;
* :mod:`server.site.layout`: where each file lives and who owns it;
* :mod:`server.site.build`: ``init_site``, ``add_device``, ``load_site``.
"""

from server.site.build import Credentials, Site, add_device, init_site, load_site
from server.site.spec import SiteSpec

__all__ = ["Credentials", "Site", "SiteSpec", "add_device", "init_site", "load_site"]
